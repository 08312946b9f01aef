"""LLMEngine: requests in, one scheduled forward pass per `step()`, finished requests out.

The engine uses the runner only through `xrt.executor.interface.Runner` and the scheduler (which
owns the KV cache manager) only through its public methods.

Overlapped decoding: with a runner that launches greedy decode steps itself (`decode_capacity` > 0,
the CUDA-graph runner), a decode `step()` launches step N+1 before it reads step N's tokens back, so the
device runs N+1 while the host does the bookkeeping of N (append, stop checks, finishing) and the
caller's work until the next `step()`. Step N+1 takes its input tokens from step N's in-graph argmax
on the device; its positions, slots and pages depend only on lengths. A sequence that finishes at
step N (end-of-sequence, stop string) has a wasted row in step N+1 whose token is dropped. Whenever
the next step cannot be predicted (prefill work, sampling, pages running out) the engine reads
back what is in flight and steps synchronously."""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from xrt.config import KVTiers, SamplingArgs, XrtConfig, runtime_check
from xrt.engine.errors import RequestError
from xrt.engine.outputs import RequestOutput
from xrt.engine.sampler import sample
from xrt.engine.scheduler import Scheduler
from xrt.engine.sequence import SeqStatus, Sequence
from xrt.engine.stop import finish_reason
from xrt.engine.tokenizer import Tokenizer
from xrt.engine.validate_prompts import Prompt, check_prompt
from xrt.engine.validate_sampling import validate_sampling
from xrt.executor.interface import PendingTokens, Runner
from xrt.kvcache.manager import KVCacheManager
from xrt.log import get_logger
from xrt.models.errors import CheckpointError

if TYPE_CHECKING:  # the tiers (and NIXL) load only with cache.tiers set
    from xrt.kvstore.peers import TierPeers
    from xrt.kvstore.tiered import TieredKVCacheManager

log = get_logger(__name__)


@dataclass(frozen=True)
class Request:
    """A checked request, ready to queue (`LLMEngine.check_request`, then `queue`)."""

    prompt_token_ids: list[int]
    sampling: SamplingArgs
    prompt: str | None  # the text, for text prompts


@dataclass(frozen=True)
class Launch:
    """A decode step on the device whose tokens the host has not read yet."""

    seqs: list[Sequence]
    positions: list[int]  # the position each row fed
    pending: PendingTokens


class LLMEngine:
    def __init__(self, cfg: XrtConfig, runner: Runner | None = None, tokenizer: Tokenizer | None = None) -> None:
        problems = runtime_check(cfg)
        if problems:
            raise ValueError("; ".join(f"{path}: {msg}" for path, msg in problems))
        self.cfg = cfg
        if runner is None:
            from xrt.distributed.factory import build_runner
            from xrt.models.checkpoint import resolve_checkpoint

            # The tokenizer first: a corrupt tokenizer.json or chat template fails in milliseconds, not after
            # the weights load.
            tokenizer = tokenizer or _checkpoint_tokenizer(resolve_checkpoint(cfg.model), cfg.chat)
            runner = build_runner(cfg)
        self.runner = runner
        if tokenizer is None:
            tokenizer = _checkpoint_tokenizer(runner.checkpoint_dir, cfg.chat)
        if isinstance(tokenizer, Tokenizer):
            if tokenizer.vocab_size > runner.vocab_size:
                # Its ids past the embedding would index out of range in the first forward pass.
                raise CheckpointError(
                    f"{tokenizer.path}: {tokenizer.vocab_size} tokens, more than the model's vocab_size="
                    f"{runner.vocab_size} (config.json)"
                )
        self.tokenizer = tokenizer
        self.eos_token_ids = tokenizer.eos_token_ids if tokenizer else []
        self.max_model_len = runner.max_model_len
        self.vocab_size = runner.vocab_size
        self.tiers: TieredKVCacheManager | None = None
        if cfg.cache.tiers is KVTiers.GPU:
            kv = KVCacheManager(runner.num_pages, runner.page_size, cfg.cache.prefix_caching)
        else:
            from xrt.kvstore.build import build_tiered

            kv = self.tiers = build_tiered(cfg, runner.kv_cache, runner.checkpoint_dir, _tier_peers(cfg, runner))
        self.scheduler = Scheduler(cfg.scheduler, kv, self.max_model_len)
        self._ids = itertools.count()
        # executor.overlap=false turns overlapping off, to measure what it buys.
        self._overlap = runner.decode_capacity > 0 and cfg.executor.overlap
        self._inflight: deque[Launch] = deque()
        self._queued: list[Sequence] = []  # queued since the last step was scheduled (KV tiers: prefetch)
        self._warned_max_tokens = False
        self.num_steps = 0
        self.num_prefill_tokens = 0
        self.num_generated_tokens = 0

    def add_request(
        self, prompt: Prompt, sampling: SamplingArgs | dict[str, Any] | None = None, *, add_special_tokens: bool = True
    ) -> int:
        """Queues a request; returns its id. A request that is invalid or can never run (see
        `check_request`) raises RequestError (a ValueError) and queues nothing."""
        params = validate_sampling(sampling, self.cfg.sampling)
        return self.queue(self.check_request(prompt, params, add_special_tokens=add_special_tokens))

    def check_request(
        self, prompt: object, sampling: SamplingArgs, *, add_special_tokens: bool = True, where: str = "prompt",
        index: int | None = None,
    ) -> Request:
        """Tokenizes and checks one prompt (sampling already validated); RequestError naming `where` for
        text that is not valid Unicode, token ids that are not ints in [0, vocab_size), an empty prompt,
        or one that can never run: no room under model.max_model_len, more than the KV cache holds."""
        checked = check_prompt(prompt, where, self.vocab_size, index)
        text: str | None = None
        if isinstance(checked, str):
            if self.tokenizer is None:
                raise RequestError(
                    where,
                    "text prompts need the checkpoint's tokenizer.json (model.load_format=dummy has none); "
                    "pass token ids instead",
                    index,
                )
            text = checked
            ids = self.tokenizer.encode(checked, add_special_tokens=add_special_tokens)
        else:
            ids = checked
        error = self.scheduler.admission_error(len(ids))
        if error is not None:
            raise RequestError(where, error, index)
        return Request(ids, sampling, text)

    def queue(self, request: Request) -> int:
        """Queues a checked request; returns its id."""
        request_id = next(self._ids)
        params, ids = request.sampling, request.prompt_token_ids
        left = self.max_model_len - len(ids)
        if params.max_tokens > left and not self._warned_max_tokens:
            # Once per engine: a batch of long prompts would otherwise log a line each.
            self._warned_max_tokens = True
            log.warning(
                f"sampling.max_tokens={params.max_tokens} is more than the {left} tokens model.max_model_len="
                f"{self.max_model_len} leaves after a {len(ids)}-token prompt: generation stops there, with "
                "finish_reason 'context_length' (logged once per engine)"
            )
        seed = params.seed if params.seed is not None else (self.cfg.seed * 1_000_003 + request_id) % 2**63
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=ids,
            sampling=params,
            seed=seed,
            prompt=request.prompt,
            detokenizer=self.tokenizer.detokenizer(len(ids)) if self.tokenizer else None,
        )
        self.scheduler.add(seq)
        if self.tiers is not None:
            self._queued.append(seq)  # prefetched if it is still waiting once a step is scheduled
        return request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.scheduler.has_finished()

    def step(self) -> list[RequestOutput]:
        """Runs one forward pass (if any work is ready); returns the requests that finished."""
        if self._overlap:
            # Keep one launch queued behind the one whose tokens are read here; starting from none,
            # launch two, so every call still yields one step's tokens (the bench counts calls).
            if not self._inflight:
                self._launch_overlapped()
            if self._inflight:
                self._launch_overlapped()
                self._prefetch_waiting()
                self._resolve(self._inflight.popleft())
                if self._inflight:
                    return self._outputs()
        self._step_sync()
        return self._outputs()

    def _step_sync(self) -> None:
        scheduled = self.scheduler.schedule()
        if scheduled is None:
            self._prefetch_waiting()
            return
        self.num_steps += 1
        step = scheduled.step
        seqs = scheduled.sampled_seqs
        if step.is_prefill:
            self.num_prefill_tokens += step.num_tokens
        if not step.is_prefill and self._launchable(seqs):
            batch = self.scheduler.decode_batch(seqs, overlapped=False)
            pending = self.runner.launch_decode(batch, None)
            self._prefetch_waiting()
            tokens = pending.tokens()
            self.scheduler.postprocess(scheduled)
        else:
            timed = self.tiers is not None and step.is_prefill
            if timed:
                # what recomputing a prefix costs, against which the tiers weigh loading it (device events:
                # no sync here)
                self.tiers.prefill_started()
            logits = self.runner.execute(step)
            if timed:
                self.tiers.prefill_done(step.num_tokens)
            self._prefetch_waiting()  # while the device runs the step
            self.scheduler.postprocess(scheduled)
            tokens = self._sample(logits, seqs) if seqs else []
        now = time.perf_counter()
        for seq, token in zip(seqs, tokens, strict=True):
            self._append(seq, token, now)
        if self.tiers is not None:
            self.tiers.start_stores()  # the chunks this step completed, now that its tokens are read back

    def _prefetch_waiting(self) -> None:
        """The KV tiers' prefetch (its L2 prefix into L1) for each request queued since the last call that the
        scheduler left waiting: one admitted at once loads from L2 at admission, and a prefetch of it would only
        compete with its own prefill (keying its tokens, reads and checksums on the host). seq.token_ids: the
        list whose chunk keys the lookup and the stores reuse."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        assert self.tiers is not None
        for seq in queued:
            if seq.status is SeqStatus.WAITING and not seq.page_table:
                self.tiers.prefetch(seq.token_ids)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        generators = [s.generator(logits.device) if s.sampling.temperature > 0 else None for s in seqs]
        return sample(logits, [s.sampling for s in seqs], generators, self.runner.last_argmax)

    def _launchable(self, seqs: list[Sequence]) -> bool:
        return len(seqs) <= self.runner.decode_capacity and all(s.sampling.temperature == 0 for s in seqs)

    def _launch_overlapped(self) -> bool:
        """Launch the next decode step while the one in flight (if any) runs; False when it cannot be."""
        seqs = self.scheduler.schedule_overlapped(self.runner.decode_capacity)
        if not seqs:
            return False
        after = self._inflight[-1].pending if self._inflight else None
        self.num_steps += 1
        batch = self.scheduler.decode_batch(seqs, overlapped=True)
        self._inflight.append(Launch(seqs, batch.positions, self.runner.launch_decode(batch, after)))
        return True

    def _resolve(self, launch: Launch) -> None:
        """Read a launched step's tokens back and do its bookkeeping."""
        tokens = launch.pending.tokens()
        now = time.perf_counter()
        self.scheduler.decode_resolved(launch.seqs, launch.positions, tokens, now, self._append)
        if self.tiers is not None:
            self.tiers.start_stores()

    def _append(self, seq: Sequence, token: int, now: float) -> None:
        self.num_generated_tokens += 1
        delta = seq.append_token(token, now)
        reason = finish_reason(seq, delta, self.eos_token_ids, self.max_model_len)
        if reason is not None:
            self.scheduler.finish(seq, reason)

    def _outputs(self) -> list[RequestOutput]:
        finished = self.scheduler.take_finished()
        for seq in finished:
            seq.finish_text()
        return [RequestOutput.from_sequence(s) for s in finished]

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions


def _tier_peers(cfg: XrtConfig, runner: Runner) -> TierPeers | None:
    """With parallel.tp > 1 every rank holds its own shard of the KV tiers: rank 0's manager reaches the
    others' through the tensor-parallel runner."""
    if cfg.parallel.tp == 1:
        return None
    from xrt.distributed.driver import TPRunner

    if not isinstance(runner, TPRunner):
        raise ValueError(f"cache.tiers={cfg.cache.tiers.value} with parallel.tp={cfg.parallel.tp} needs the "
                         f"tensor-parallel runner, got {type(runner).__name__}")
    return runner.kv_peers()


def _checkpoint_tokenizer(checkpoint_dir: str | None, chat: bool) -> Tokenizer | None:
    """The checkpoint's tokenizer.json, if it has one (dummy weights have none); with `chat`, its chat template
    checked too."""
    if not checkpoint_dir or not os.path.exists(os.path.join(checkpoint_dir, "tokenizer.json")):
        return None
    tokenizer = Tokenizer(checkpoint_dir)
    if chat:
        tokenizer.check_chat_template()
    return tokenizer
