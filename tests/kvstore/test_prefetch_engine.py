"""The engine with L2 prefetch on (cache.l2.prefetch, the default): a queued request's L2 prefix is read into
L1 before its admission, counted as L2's, and the outputs stay those of cache=gpu."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
from test_tiered_engine import CHUNK, SAMPLING, cache, outputs, prompts, tiers_of

from xrt.config import KVTiers, SamplingArgs, SchedulerArgs, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.stats import GPU, L1, L2


def test_a_queued_request_is_prefetched(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """One sequence at a time: the second request waits behind the first while its prefix (5 chunks in L2
    from an earlier engine) is prefetched, so its admission loads nothing from L2 itself."""
    want = [outputs(LLM(diverse_cfg(cache=cache(KVTiers.GPU, tmp_path))), [p])[0] for p in prompts(0)]
    first = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    outputs(first, prompts(0)[:1])
    tiers_of(first).close()
    cfg = diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path, prefetch=True), scheduler=SchedulerArgs(max_num_seqs=1))
    llm = LLM(cfg)
    tiers = tiers_of(llm)
    assert tiers.agent.prefetcher is not None
    long = SamplingArgs(max_tokens=40, ignore_eos=True)
    other = prompts(1)[1]
    outs = llm.generate([other, prompts(0)[2]], [long, SAMPLING], use_tqdm=False)
    assert outs[1].token_ids == want[2]
    assert outs[1].cached_tokens == {GPU: 0, L1: 0, L2: 5 * CHUNK}
    s = tiers.stats
    assert s.prefetched_chunks == 5 and s.prefetch_bytes == 5 * tiers.layout.nbytes
    assert s.loaded_bytes[L2] == 0  # nothing was left for the admission to read


def test_prefetch_off_loads_at_admission(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    first = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    outputs(first, prompts(0)[:1])
    tiers_of(first).close()
    cfg = diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path, prefetch=False))
    llm = LLM(cfg)
    assert tiers_of(llm).agent.prefetcher is None
    out = llm.generate([prompts(0)[2]], SAMPLING, use_tqdm=False)[0]
    s = tiers_of(llm).stats
    assert out.cached_tokens[L2] == 5 * CHUNK and s.prefetched_chunks == 0
    assert s.loaded_bytes[L2] == 5 * tiers_of(llm).layout.nbytes
    assert attrs.fields(type(cfg.cache.l2)).prefetch.default is True  # the default is on


def test_a_request_admitted_at_once_is_not_prefetched(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """Prefetch on, nothing ahead of the request: its first schedule admits it and loads its L2 prefix itself; a
    prefetch would only have competed with its own prefill on the host."""
    first = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    outputs(first, prompts(0)[:1])
    tiers_of(first).close()
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path, prefetch=True), scheduler=SchedulerArgs(max_num_seqs=1)))
    tiers = tiers_of(llm)
    assert tiers.agent.prefetcher is not None
    asked: list[int] = []  # the prompt lengths the engine asked the tiers to prefetch
    prefetch = tiers.prefetch
    tiers.prefetch = lambda ids: (asked.append(len(ids)), prefetch(ids))[1]  # type: ignore[method-assign]
    out = llm.generate([prompts(0)[2]], SAMPLING, use_tqdm=False)[0]
    s = tiers.stats
    assert asked == [] and out.cached_tokens[L2] == 5 * CHUNK and s.prefetched_chunks == 0
    assert s.loaded_bytes[L2] == 5 * tiers.layout.nbytes
    # one behind another (one sequence at a time): that one waits, and is prefetched
    behind = prompts(1)[1]
    llm.generate([behind, prompts(0)[0]], [SamplingArgs(max_tokens=8, ignore_eos=True), SAMPLING], use_tqdm=False)
    assert asked == [len(prompts(0)[0])]
