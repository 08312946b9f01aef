"""`TPRunner`: rank 0's `Runner` for parallel.tp > 1. The engine sees one runner; each call sends the step
to the other ranks first, then runs it on rank 0's own `ModelRunner`, whose collectives meet the workers'.
Rank 0 alone schedules, samples and detokenizes; the workers only execute.

Failure: a call that finds a worker gone raises `WorkerFailed` naming the rank and its error (the watchdog
notices a dead worker at once and stops the rest, so rank 0 never waits out the timeout for one). After any
error inside a call the ranks may be out of step, so the runner refuses further calls and its shutdown
terminates the workers instead of asking them to leave."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from xrt.config import XrtConfig
from xrt.distributed.env import torchrun_env
from xrt.distributed.errors import WorkerFailed
from xrt.distributed.kv_peers import KVPeers
from xrt.distributed.launch import Ranks
from xrt.distributed.wire import Kind, encode_launch, encode_step
from xrt.executor.graphs.capture import CaptureStrategy
from xrt.executor.interface import PendingTokens
from xrt.executor.runner import ModelRunner
from xrt.executor.step import DecodeBatch, StepInput
from xrt.models.checkpoint import resolve_checkpoint
from xrt.ops.parallel_state import TPState, swap_tp

T = TypeVar("T")


class TPRunner:
    """capture: as for ModelRunner, on every rank (it must pickle: the workers are spawned)."""

    def __init__(self, cfg: XrtConfig, capture: CaptureStrategy | None = None) -> None:
        # Before any process starts: a bad model.path fails here, and the tiny checkpoint is made once.
        resolve_checkpoint(cfg.model)
        env = torchrun_env()
        self._ranks = Ranks.torchrun(cfg, env) if env is not None else Ranks.spawn(cfg, capture)
        self._closer = weakref.finalize(self, self._ranks.close)
        groups = self._ranks.groups
        assert groups is not None
        self._state = TPState(groups.rank, groups.size, groups.model, groups.cpu)
        try:
            self._local = self._call(lambda: ModelRunner(cfg, capture))
        except BaseException:
            self.close()
            raise
        self._channel = self._ranks.open_channel()
        local = self._local
        self.device = local.device
        self.num_pages = local.num_pages
        self.page_size = local.page_size
        self.max_model_len = local.max_model_len
        self.vocab_size = local.vocab_size
        self.checkpoint_dir = local.checkpoint_dir
        self.kv_cache = local.kv_cache  # rank 0's shard: its KV tiers copy from it (the others from theirs)
        self.decode_capacity = local.decode_capacity
        self.tp = groups.size

    @property
    def last_argmax(self) -> torch.Tensor | None:
        return self._local.last_argmax

    @property
    def local(self) -> ModelRunner:
        """Rank 0's own runner (its shard of the model)."""
        return self._local

    def execute(self, step: StepInput) -> torch.Tensor:
        def run() -> torch.Tensor:
            self._channel.send(Kind.STEP, encode_step(step))
            return self._local.execute(step)

        return self._call(run)

    def launch_decode(self, batch: DecodeBatch, after: PendingTokens | None) -> PendingTokens:
        def run() -> PendingTokens:
            self._channel.send(Kind.LAUNCH, encode_launch(batch, after is not None, self.page_size))
            return self._local.launch_decode(batch, after)

        return self._call(run)

    def send_then(self, kind: Kind, payload: np.ndarray | None, then: Callable[[], T]) -> T:
        """Send a message to the workers, then run `then` on rank 0 (whose collectives, if any, meet those
        the workers run for the message); failures as for a step."""

        def run() -> T:
            self._channel.send(kind, payload)
            return then()

        return self._call(run)

    def kv_peers(self) -> KVPeers:
        """The other ranks' KV tier shards, for rank 0's tiered KV manager."""
        return KVPeers(self)

    @property
    def closed(self) -> bool:
        return self._ranks.closed

    def close(self) -> None:
        """Stop the workers and release the process groups (also when collected, and at exit)."""
        self._closer()

    def _call(self, fn: Callable[[], T]) -> T:
        ranks = self._ranks
        if ranks.broken or ranks.failure():
            raise WorkerFailed(ranks.failure() or f"tensor-parallel ranks out of step after an error ({ranks.broken})")
        previous = swap_tp(self._state)
        try:
            return fn()
        except BaseException as e:
            raised = ranks.failed(e)
            if raised is e:
                raise
            raise raised from e
        finally:
            swap_tp(previous)
