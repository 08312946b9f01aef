"""A new engine on an L2 directory another engine filled and closed: its prefixes come from L2 (counted exactly),
its outputs equal cache=gpu's, it stores only what L2 lacks, and storing a chunk L2 already holds leaves the
file alone."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from kvstore_support import (
    CHUNK,
    break_transfers,
    check_l2_dir,
    child_result,
    computed_keys,
    file_ids,
    generate_each,
    kill_left,
    namespace_dir,
    reference,
    settle,
    spawn_child,
    tail,
    tier_cache,
    tiers_of,
    tokens,
)

from xrt.config import KVTiers, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.connector import GPU, L1, L2
from xrt.kvstore.l2 import L2Store


def test_restart_reads_prefixes_from_l2(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """Engine A stores two prefixes (5 and 3 chunks) and closes; engine B, new, on the same cache.l2.path, meets
    them again under other tails."""
    rng = random.Random(2)
    p1, p2 = tokens(rng, 5 * CHUNK + 3), tokens(rng, 3 * CHUNK)
    first = [p1 + tail(rng, 0, 7), p2 + tail(rng, 1, 5)]
    second = [p1 + tail(rng, 2, 4), p2 + tail(rng, 3, 9), p1 + tail(rng, 4, 6), p2 + tail(rng, 5, 3)]
    want = reference(diverse_cfg, first + second)

    a = LLM(diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path)))
    assert generate_each(a, first) == want[:2]
    settle(tiers_of(a), close=True)
    d = namespace_dir(tmp_path)
    ns = tiers_of(a).namespace
    stored = check_l2_dir(d)
    assert set(stored) == computed_keys([p + o for p, o in zip(first, want[:2], strict=True)], ns)

    b = LLM(diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path)))
    assert generate_each(b, second) == want[2:]
    stats = tiers_of(b).stats
    # second[0] and [1] read p1's 5 and p2's 3 chunks from L2; [2] and [3] find the same whole pages on the GPU
    assert stats.hit_tokens == {GPU: 8 * CHUNK, L1: 0, L2: 8 * CHUNK} and stats.failed_loads == 0
    assert b.engine.num_prefill_tokens == sum(map(len, second)) - 16 * CHUNK
    settle(tiers_of(b), close=True)
    after = check_l2_dir(d)
    assert set(after) == set(stored) | computed_keys([p + o for p, o in zip(second, want[2:], strict=True)], ns)
    assert {k: after[k] for k in stored} == stored  # what A wrote is still there, unchanged
    assert stats.stored_l2 == len(after) - len(stored)  # B wrote only what L2 lacked


@pytest.mark.parametrize("recompute", ["last-chunk", "every-chunk"])
def test_storing_a_chunk_l2_holds_leaves_it_alone(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recompute: str
) -> None:
    """A second engine computes chunks L2 already holds and hands them to its L2 writer: the store is a no-op,
    every file keeps its inode and mtime and the index is not rewritten. last-chunk: the prompt is exactly 4
    chunks, so the 4th is computed (its last token) although L2 has it; every-chunk: the second engine's L2
    reads fail, so it recomputes the whole prompt."""
    rng = random.Random(5)
    prompt = tokens(rng, 4 * CHUNK)
    want = reference(diverse_cfg, [prompt])
    a = LLM(diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path)))
    assert generate_each(a, [prompt]) == want
    settle(tiers_of(a), close=True)
    d = namespace_dir(tmp_path)
    entries = check_l2_dir(d)
    before = file_ids(d)
    assert len(entries) == 4

    asked: list[str] = []  # every key the writer asked L2 to store
    store = L2Store.store

    def recording_store(self: L2Store, items: list[tuple[bytes, int, int | None]]) -> list[bytes]:
        asked.extend(k.hex() for k, _, _ in items)
        return store(self, items)

    monkeypatch.setattr(L2Store, "store", recording_store)
    b = LLM(diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path)))
    tiers = tiers_of(b)
    if recompute == "every-chunk":
        break_transfers(monkeypatch, tiers.l2, "load", "err")
    assert generate_each(b, [prompt]) == want
    settle(tiers, close=True)
    stats = tiers.stats
    loaded = 0 if recompute == "every-chunk" else 3
    assert stats.hit_tokens == {GPU: 0, L1: 0, L2: loaded * CHUNK}
    assert stats.stored_l1 == 4 - loaded and stats.dropped_l2 == 0
    assert set(asked) <= set(entries) and len(asked) == 4 - loaded  # it was asked, for chunks L2 holds
    assert stats.stored_l2 == 0
    assert file_ids(d) == before and check_l2_dir(d) == entries


def test_exit_without_close_still_writes_l2(
    diverse_cfg: Callable[..., XrtConfig], tiny_checkpoint_diverse: str, tmp_path: Path
) -> None:
    """A process that exits with stores still queued (no flush, no close): the manager's exit hook writes them,
    after the interpreter has stopped taking work on its executors (the checksums then run in the hook's thread),
    so the directory holds every computed chunk, whole and verified."""
    rng = random.Random(5)
    prompts = [tokens(rng, 4 * CHUNK + 2) + tail(rng, 0, 5), tokens(rng, 3 * CHUNK) + tail(rng, 1, 3)]
    spec = {"checkpoint": tiny_checkpoint_diverse, "l2_path": str(tmp_path / "l2"), "prompts": prompts,
            "out": str(tmp_path / "out.json"), "exit_unflushed": True, "slow_l2_store": 0.3}
    proc = spawn_child(spec, tmp_path / "spec.json")
    try:
        result = child_result(proc, spec)
    finally:
        kill_left([proc])
    stored = check_l2_dir(namespace_dir(tmp_path / "l2"))
    ns = tiers_of(LLM(diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path / "other")))).namespace
    want = computed_keys([p + o for p, o in zip(prompts, result["outputs"], strict=True)], ns)
    assert len(want) >= 7 and set(stored) == want
