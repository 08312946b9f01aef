"""The engine over L1/L2 (xrt/kvstore/connector.py): greedy outputs equal to the GPU-only cache while prefixes
come back from L1 and L2, hits counted per tier, and a new engine on the same directory loading from L2."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from xrt.config import CacheArgs, KVTiers, L1Args, L2Args, L2LoadPolicy, SamplingArgs, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvcache.interface import PrefixHit
from xrt.kvstore.connector import GPU, L1, L2, TieredConnector

CHUNK = 16
SAMPLING = SamplingArgs(max_tokens=6, ignore_eos=True)


def prompts(seed: int) -> list[list[int]]:
    """Four prompts: two long shared prefixes (5 and 3 chunks), distinct tails of uneven length."""
    rng = random.Random(seed)
    shared = [[rng.randrange(3, 2000) for _ in range(n)] for n in (5 * CHUNK + 3, 3 * CHUNK)]
    return [shared[i % 2] + [rng.randrange(3, 2000) for _ in range(5 + 7 * i)] for i in range(4)]


def cache(tiers: KVTiers, path: Path, policy: L2LoadPolicy = L2LoadPolicy.ALWAYS,
          prefetch: bool = False) -> CacheArgs:
    """Loads exactly what the tiers hold (`always`): the measured policy would turn on this machine's timing.
    No prefetch unless asked: these tests follow the loads at admission (test_prefetch_engine.py: with it)."""
    return CacheArgs(page_size=4, num_pages=256, chunk_tokens=CHUNK, tiers=tiers, l1=L1Args(size_gb=0.002),
                     l2=L2Args(path=str(path), load_policy=policy, prefetch=prefetch))


def outputs(llm: LLM, batch: list[list[int]]) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(batch, SAMPLING, use_tqdm=False)]


def tiers_of(llm: LLM) -> TieredConnector:
    tiers = llm.engine.runner.connector
    assert isinstance(tiers, TieredConnector)
    return tiers


@pytest.fixture
def want(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> list[list[int]]:
    llm = LLM(diverse_cfg(cache=cache(KVTiers.GPU, tmp_path)))
    return [outputs(llm, [p])[0] for p in prompts(0)]


def test_l1_l2_outputs_equal_gpu_only(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path,
                                      want: list[list[int]]) -> None:
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    tiers = tiers_of(llm)
    got = []
    for p in prompts(0):
        llm.engine.scheduler.kv.evict()  # forget the GPU prefix cache: the shared prefix must come from L1
        got.append(outputs(llm, [p])[0])
    assert got == want
    # prompts 2 and 3 find their shared prefix's whole chunks (5 and 3) in L1; nothing was GPU-only
    assert tiers.stats.hit_tokens == {GPU: 0, L1: 8 * CHUNK, L2: 0}
    tiers.flush()
    assert tiers.stats.stored_l2 == tiers.stats.stored_l1 > 0 and tiers.stats.dropped_l2 == 0

    # a new engine (empty GPU cache and L1) on the same directory: the prefixes come from L2
    again = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    assert [outputs(again, [p])[0] for p in prompts(0)] == want
    stats = tiers_of(again).stats
    assert stats.hit_tokens[L2] >= (5 + 3) * CHUNK and stats.failed_loads == 0


def test_l1_only_in_one_batch(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path,
                              want: list[list[int]]) -> None:
    """All prompts at once: the GPU prefix cache serves what it holds, L1 what it evicted."""
    cfg = diverse_cfg(cache=cache(KVTiers.L1, tmp_path))
    llm = LLM(cfg)
    assert tiers_of(llm).l2 is None
    assert outputs(llm, prompts(0)) == want
    llm.engine.scheduler.kv.evict()
    assert outputs(llm, prompts(0)) == want
    assert tiers_of(llm).stats.hit_tokens[L1] > 0
    assert not list(tmp_path.iterdir())  # l1 writes no files


def test_one_copy_up_for_a_steps_admissions(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path,
                                            want: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompts admitted in one step that all find prefixes in L1 are copied up in one scatter (layer group by
    layer group across every sequence), issued before the pass that reads them: copied one sequence after
    another, the first layer waited for almost the whole load."""
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1, tmp_path)))
    tiers = tiers_of(llm)
    assert outputs(llm, prompts(0)) == want
    llm.engine.scheduler.kv.evict()
    calls: list[int] = []
    scatter = tiers.agent.copier.scatter_chunks

    def counted(chunks):  # type: ignore[no-untyped-def]
        calls.append(len(chunks))
        return scatter(chunks)

    monkeypatch.setattr(tiers.agent.copier, "scatter_chunks", counted)
    before = tiers.stats.hit_tokens[L1]
    assert outputs(llm, prompts(0)) == want
    loaded = tiers.stats.hit_tokens[L1] - before
    # all four admitted in the first step, each loading every whole chunk of its prompt (stored the first time)
    chunks = [(len(p) - 1) // CHUNK for p in prompts(0)]
    assert loaded == sum(chunks) * CHUNK
    assert calls == [sum(chunks)]


def test_corrupt_l2_chunk_is_recomputed(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path,
                                        want: list[list[int]]) -> None:
    first = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    outputs(first, prompts(0)[:1])
    tiers_of(first).flush()
    files = sorted(tmp_path.glob("xrt-kv-*/*.kv"))
    assert len(files) == 5
    for f in files:  # flip a byte in every chunk: all of them must be misses, the output unchanged
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 1
        f.write_bytes(bytes(data))
    again = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    assert outputs(again, prompts(0)[:1]) == want[:1]
    # every chunk is a miss: found bad by the start-up bandwidth probe (which reads the most recent two) or by the
    # load at admission, whichever reads it first (which ones the probe picks depends on the index's timestamps)
    tiers = tiers_of(again)
    assert tiers.stats.hit_tokens[L2] == 0 and tiers.l2 is not None and tiers.l2.corrupt >= 1


def test_gpu_hit_ending_inside_a_chunk(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path,
                                       want: list[list[int]]) -> None:
    """The GPU cache lost only the tail pages of a prefix (tail pages are evicted first): the GPU serves the
    pages it kept, L1 the rest of the chunk they end in and the chunks after it."""
    mid_chunk = 0
    for n in range(2, 12, 3):
        llm = LLM(diverse_cfg(cache=cache(KVTiers.L1, tmp_path)))
        tiers = tiers_of(llm)
        outputs(llm, prompts(0)[:1])
        llm.engine.scheduler.kv.evict(max_pages=n)
        assert outputs(llm, [prompts(0)[2]]) == [want[2]], n
        gpu, l1 = tiers.stats.hit_tokens[GPU], tiers.stats.hit_tokens[L1]
        assert gpu + l1 == 5 * CHUNK, n  # the whole shared prefix, from one tier or the other
        mid_chunk += gpu % CHUNK != 0 and l1 > 0
    assert mid_chunk > 0


def test_l2_load_slower_than_recompute_is_skipped(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path,
                                                  want: list[list[int]]) -> None:
    first = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    outputs(first, prompts(0)[:1])
    tiers_of(first).flush()
    again = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path, L2LoadPolicy.MEASURED)))
    tiers = tiers_of(again)
    tiers.policy.l2_bandwidth, tiers.policy.prefill_rate = 1.0, 1e12  # 1 byte/s storage against instant prefill
    keyed: list[int] = []  # chunks keyed by lookups
    chunk_keys, match = tiers.keys.keys, tiers.match
    looking: list[bool] = [False]

    def keys(token_ids: list[int], n: int) -> list[bytes]:
        if looking[0]:
            keyed.append(n)
        return chunk_keys(token_ids, n)

    def counted_match(token_ids: list[int], gpu: PrefixHit) -> PrefixHit:
        looking[0] = True
        try:
            return match(token_ids, gpu)
        finally:
            looking[0] = False

    tiers.keys.keys, tiers.match = keys, counted_match  # type: ignore[method-assign]
    assert outputs(again, [prompts(0)[2]]) == [want[2]]
    assert tiers.stats.hit_tokens[L2] == 0 and tiers.stats.skipped_slow >= 1
    # the lookup keyed the first chunk only: the policy cuts an L2 run whole, so the rest was not worth keying
    assert keyed and max(keyed) == 1
    tiers.flush()
    fast = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path, L2LoadPolicy.MEASURED)))
    tiers_of(fast).policy.l2_bandwidth, tiers_of(fast).policy.prefill_rate = 1e15, 1.0  # now loading wins
    assert outputs(fast, [prompts(0)[2]]) == [want[2]] and tiers_of(fast).stats.hit_tokens[L2] >= 5 * CHUNK


def test_a_stalled_l2_never_blocks_generation(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """The L2 writer stuck in a transfer (its agent's lock held here): generation still finishes, the chunks
    past the writer's bounded queue are dropped and counted, and the queued ones land once it resumes."""
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    tiers = tiers_of(llm)
    assert tiers.l2 is not None
    rng = random.Random(1)
    # 120 chunks: more than the writer's queue (half of L1's slots) and the batch it is stuck in hold
    batch = [[rng.randrange(3, 2000) for _ in range(10 * CHUNK + 1)] for _ in range(12)]
    assert tiers.agent.writer is not None and tiers.agent.writer.queue.maxsize + 8 < 120 <= tiers.l1.num_slots
    with tiers.l2._agents["WRITE"].lock:
        outs = llm.generate(batch, SAMPLING, use_tqdm=False)
        assert all(len(o.token_ids) == SAMPLING.max_tokens for o in outs)
        assert tiers.stats.dropped_l2 > 0
    tiers.flush()
    s = tiers.stats
    assert s.stored_l1 == 120 and s.stored_l2 + s.dropped_l2 == 120 and s.stored_l2 > 0
