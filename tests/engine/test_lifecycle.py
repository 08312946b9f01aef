"""An engine's lifecycle: `LLM.close()` and `with xrt.LLM(cfg) as llm:` stop every thread and worker process the engine
started, flush the L2 writer (bounded by cache.l2.flush_timeout_s) and write the load policy's measurements; a
writer that never finishes holds neither close nor the interpreter's exit."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

import xrt
from tests.kvstore.kvstore_support import CHUNK, namespace_dir, tier_cache, tokens
from xrt.config import KVTiers, ParallelArgs, SamplingArgs, XrtConfig
from xrt.kvstore.l2_files import MEASUREMENTS

SAMPLING = SamplingArgs(max_tokens=4, ignore_eos=True)


def engine_threads() -> set[threading.Thread]:
    """The live threads xrt starts (the tiers', tensor parallelism's): compared as objects, since an engine an
    earlier test left open has threads of the same names."""
    return {t for t in threading.enumerate() if t.name.startswith("xrt-")}


def children() -> set[int]:
    """This process's live child processes (spawned tensor-parallel workers among them)."""
    return {p.pid for p in multiprocessing.active_children()}


def prompts(n: int = 3) -> list[list[int]]:
    import random

    rng = random.Random(7)
    return [tokens(rng, 3 * CHUNK + 5) for _ in range(n)]


def test_close_stops_the_tier_threads_and_writes_the_measurements(
        diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    before = engine_threads()
    cache = tier_cache(KVTiers.L1_L2, tmp_path)
    cache = attrs.evolve(cache, l2=attrs.evolve(cache.l2, prefetch=True))
    with xrt.LLM(diverse_cfg(cache=cache)) as llm:
        llm.generate(prompts(), SAMPLING, use_tqdm=False)
        started = engine_threads() - before
        assert {t.name for t in started} >= {"xrt-kv-l2", "xrt-kv-prefetch"}  # what close must stop
        stats = llm.stats()
        assert stats["tiers"].as_dict()["stored_chunks_l2"] > 0  # the writer went through its queue first
    assert engine_threads() - before == set()
    measured = namespace_dir(tmp_path) / MEASUREMENTS
    assert measured.exists() and "prefill_rate" in measured.read_text()
    llm.close()  # idempotent


def test_close_of_a_tensor_parallel_engine_leaves_no_process(
        diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    before_threads, before_children = engine_threads(), children()
    cfg = diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path), parallel=ParallelArgs(tp=2))
    llm = xrt.LLM(cfg)
    try:
        assert children() - before_children  # the spawned worker
        llm.generate(prompts(2), SAMPLING, use_tqdm=False)
    finally:
        llm.close()
    assert children() - before_children == set()
    assert engine_threads() - before_threads == set()
    # every rank flushed and wrote its own directory; rank 0 also its policy's measurements
    dirs = list(tmp_path.glob("xrt-kv-*"))
    assert len(dirs) == 2 and sum((d / MEASUREMENTS).exists() for d in dirs) == 1


def test_a_stuck_l2_writer_holds_close_no_longer_than_the_flush_timeout(
        diverse_cfg: Callable[..., XrtConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tier_cache(KVTiers.L1_L2, tmp_path)
    cfg = diverse_cfg(cache=attrs.evolve(cache, l2=attrs.evolve(cache.l2, flush_timeout_s=0.5)))
    llm = xrt.LLM(cfg)
    release = threading.Event()
    l2 = llm.engine.runner.connector.l2  # type: ignore[attr-defined]
    monkeypatch.setattr(l2, "store", lambda items: release.wait() and [])  # a store that never returns
    llm.generate(prompts(), SAMPLING, use_tqdm=False)
    start = time.perf_counter()
    llm.close()
    took = time.perf_counter() - start
    release.set()
    assert took < 10, f"close waited {took:.1f} s for a stuck writer (flush_timeout_s=0.5)"


def test_a_process_that_never_closes_its_engine_still_exits(tiny_checkpoint_diverse: str, tmp_path: Path) -> None:
    """The exit hook's flush of a stuck writer is bounded too: the interpreter exits."""
    script = textwrap.dedent(f"""
        import sys, threading
        sys.path[:0] = {[str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]!r}
        from conftest import tiny_config
        from kvstore.kvstore_support import tier_cache
        import attrs, xrt
        from xrt.config import KVTiers, SamplingArgs
        from xrt.kvstore.l2 import L2Store
        never = threading.Event()
        L2Store.store = lambda self, items: never.wait()
        cache = tier_cache(KVTiers.L1_L2, {str(tmp_path)!r})
        cache = attrs.evolve(cache, l2=attrs.evolve(cache.l2, flush_timeout_s=0.5))
        llm = xrt.LLM(tiny_config({tiny_checkpoint_diverse!r}, cache=cache))
        llm.generate([list(range(3, 60))], SamplingArgs(max_tokens=4, ignore_eos=True), use_tqdm=False)
        print("generated", flush=True)
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "generated" in r.stdout, r.stderr
