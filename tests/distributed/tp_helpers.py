"""What the tensor-parallel tests share: checkpoints written by transformers in odd shapes, a capture strategy
that fails on one rank (it reaches the spawned workers by pickle, so it lives in an importable module), the
far end of the channel test, and processes found by a tag in their environment (orphans included)."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from hf_checkpoint import write_hf_qwen3

from xrt.config import XrtConfig
from xrt.executor.graphs.capture import RerunCapture, RerunGraph

REPO = Path(__file__).resolve().parents[2]
TAG_VAR = "XRT_TEST_TAG"  # not read by xrt: inherited by every process a run starts, so the test can find them


def this_rank() -> int:
    """This process's rank: a spawned worker's, or 0 (rank 0, or no tensor-parallel run)."""
    return dist.get_rank() if dist.is_initialized() else 0


def tiny_config(checkpoint_dir: str, **sections: Any) -> XrtConfig:
    """The tiny model's shape at `checkpoint_dir` on CPU in float32; `sections` replace config sections (as
    tests/conftest.py's tiny_config, which a module of this folder cannot import by name: tests/gpu has a
    conftest too)."""
    import attrs

    from xrt.config import Device, DType
    from xrt.models.tiny import tiny_model_args

    model = attrs.evolve(tiny_model_args(), path=checkpoint_dir, dtype=DType.FLOAT32)
    return XrtConfig(model=model, device=Device.CPU, **sections)


def write_checkpoint(path: str, tokenizer_from: str, *, vocab_size: int, num_kv_heads: int, tied: bool,
                     seed: int, intermediate_size: int = 96, num_heads: int = 4) -> str:
    """A Qwen3 checkpoint saved by transformers (large random weights, so greedy continuations depend on the
    whole context) with the tiny checkpoint's tokenizer files."""
    write_hf_qwen3(path, seed=seed, tied=tied, vocab_size=vocab_size, num_kv_heads=num_kv_heads,
                   intermediate_size=intermediate_size, num_heads=num_heads, max_position_embeddings=512)
    for name in os.listdir(tokenizer_from):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "generation_config.json"):
            shutil.copy(os.path.join(tokenizer_from, name), os.path.join(path, name))
    return path


class FailingGraph(RerunGraph):
    def __init__(self, fn: Callable[[], object], capture: FailingCapture) -> None:
        super().__init__(fn)
        self.capture = capture

    def replay(self) -> None:
        c = self.capture
        if this_rank() == c.rank:
            c.replays += 1
            if c.replays > c.after:
                raise RuntimeError(f"injected failure at replay {c.replays}")
        super().replay()


class FailingCapture(RerunCapture):
    """RerunCapture whose graphs raise on rank `rank` once it replayed `after` of them (a worker failing mid-run)."""

    def __init__(self, rank: int, after: int) -> None:
        self.rank = rank
        self.after = after
        self.replays = 0

    def capture(self, fn: Callable[[], Any]) -> tuple[RerunGraph, Any]:
        return FailingGraph(fn, self), fn()


class FailingWarmUp(RerunCapture):
    """RerunCapture that raises on rank `rank` when it warms the first graph up (a worker failing at start-up)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def warm_up(self, fn: Callable[[], object]) -> None:
        if this_rank() == self.rank:
            raise MemoryError("injected: no room for the decode graphs")
        fn()


def channel_peer(cfg: XrtConfig, port: int, results: multiprocessing.Queue, channel_timeout_s: float) -> None:
    """Rank 1 of the channel test: joins rank 0's store, reports the collectives' results, then every message it
    receives (kind, decoded) until SHUTDOWN, then how long one more wait for a message took to time out."""
    from xrt.distributed.channel import StepChannel
    from xrt.distributed.groups import check_in, close_groups, init_groups, join_store
    from xrt.distributed.wire import Kind, decode_launch, decode_step
    from xrt.ops.collectives import min_over_ranks
    from xrt.ops.parallel_state import TPState

    store = join_store(cfg, port)
    check_in(store)
    groups = init_groups(cfg, 1, 1, store)
    tp = TPState(1, 2, groups.model, groups.cpu)
    results.put(("min", min_over_ranks(5, tp)))
    x = torch.full((2, 3), 10.0)
    torch.ops.xrt.all_reduce_(x, tp.group_name)
    results.put(("all_reduce", x.tolist()))
    results.put(("all_gather", torch.ops.xrt.all_gather(torch.full((2, 1), 1.0), -1, 2, tp.group_name).tolist()))
    # The channel over a group with a short timeout (the run's timeout_s also bounds the start-up).
    channel = StepChannel(dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=channel_timeout_s)))
    while True:
        kind, payload = channel.recv()
        if kind is Kind.SHUTDOWN:
            break
        if kind is Kind.STEP:
            results.put(("step", decode_step(payload)))
        elif kind is Kind.LAUNCH:
            batch, after = decode_launch(payload)
            results.put(("launch", (list(batch.token_ids), list(batch.sources), list(batch.positions),
                                    list(batch.table_rows), batch.page_tables.tolist(), after)))
        else:
            results.put(("keepalive", int(payload.size)))
    start = time.monotonic()
    try:
        channel.recv()
        results.put(("late message", None))
    except RuntimeError:
        results.put(("timed out", time.monotonic() - start))
    close_groups()


def tagged_env(tag: str | None = None, **extra: str) -> tuple[str, dict[str, str]]:
    """(tag, environment) for a CLI run whose processes `tagged_pids(tag)` finds (workers inherit it)."""
    tag = tag or uuid.uuid4().hex
    env = {**os.environ, TAG_VAR: tag, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **extra}
    return tag, env


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries the tag (zombies and this process excluded)."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def wait_until(predicate: Callable[[], bool], timeout_s: float, every_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return predicate()


def xrt_cli(*args: str, env: dict[str, str], **popen: Any) -> subprocess.Popen:
    """`python -m xrt ...` from the repository root, in a session of its own (signals go to all of it)."""
    popen.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "xrt", *args], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)


def tp_workers() -> list[multiprocessing.process.BaseProcess]:
    """The live tensor-parallel workers this process spawned (named by xrt.distributed.launch); other
    children, such as a joblib sweep's pool from an earlier test, are not ours to check."""
    return [p for p in multiprocessing.active_children() if p.name.startswith("xrt-tp-rank")]
