"""Shared prefixes around the chunk size at engine level: what the GPU pages, L1 and L2 serve is exactly what the
page and chunk arithmetic says (whole pages from the GPU, whole chunks from a tier, the last prompt token always
computed), the engine prefills only the rest, and greedy outputs equal cache=gpu's."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from kvstore_support import (
    CHUNK,
    ENGINE_LAYOUT,
    generate_each,
    reference,
    settle,
    tail,
    tier_cache,
    tiers_of,
    tokens,
)

from xrt.config import KVTiers, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.connector import GPU, L1, L2

PAGE = 4


@pytest.mark.parametrize(
    ("prefix", "tail_len", "chunks"),
    [
        pytest.param(CHUNK - 1, 5, 0, id="shorter-than-a-chunk"),
        pytest.param(CHUNK, 5, 1, id="one-chunk"),
        pytest.param(CHUNK + 1, 5, 1, id="one-chunk-and-a-token"),
        pytest.param(2 * CHUNK - 1, 5, 1, id="a-token-short-of-two"),
        # the prompt is the prefix: k whole chunks, its last token must be computed, so k-1 chunks load
        pytest.param(CHUNK, 0, 0, id="prompt-of-exactly-1-chunk"),
        pytest.param(3 * CHUNK, 0, 2, id="prompt-of-exactly-3-chunks"),
        pytest.param(3 * CHUNK + 1, 0, 3, id="prompt-of-3-chunks-and-a-token"),
    ],
)
def test_prefix_hits_follow_chunk_arithmetic(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path, prefix: int, tail_len: int, chunks: int
) -> None:
    """A stores the shared prefix's chunks; B1 finds it in the GPU pages, B2 (GPU prefix cache evicted) in L1,
    B3 (a new engine on the same directory) in L2. Each B is the prefix and its own tail."""
    rng = random.Random(prefix * 7 + tail_len)
    shared = tokens(rng, prefix)
    a = shared + tail(rng, 0, 5)
    b1, b2, b3 = (shared + (tail(rng, j, tail_len) if tail_len else []) for j in (1, 2, 3))
    want = reference(diverse_cfg, [a, b1, b2, b3])
    assert len(b1) == len(b2) == len(b3) == prefix + tail_len

    llm = LLM(diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path)))
    tiers = tiers_of(llm)
    assert tiers.layout == ENGINE_LAYOUT
    assert generate_each(llm, [a]) == want[:1]
    assert tiers.stats.hit_tokens == {GPU: 0, L1: 0, L2: 0}

    # GPU: whole pages of the shared prefix, at most up to the page before the last token
    gpu = min(prefix // PAGE, (len(b1) - 1) // PAGE) * PAGE
    before = llm.engine.num_prefill_tokens
    assert generate_each(llm, [b1]) == want[1:2]
    assert tiers.stats.hit_tokens == {GPU: gpu, L1: 0, L2: 0}
    assert llm.engine.num_prefill_tokens - before == len(b1) - gpu

    # L1: whole chunks only
    llm.engine.scheduler.kv.evict()
    before = llm.engine.num_prefill_tokens
    assert generate_each(llm, [b2]) == want[2:3]
    assert tiers.stats.hit_tokens == {GPU: gpu, L1: chunks * CHUNK, L2: 0}
    assert llm.engine.num_prefill_tokens - before == len(b2) - chunks * CHUNK
    settle(tiers, close=True)

    # L2: the same chunks, read by a new engine
    again = LLM(diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path)))
    assert generate_each(again, [b3]) == want[3:]
    stats = tiers_of(again).stats
    assert stats.hit_tokens == {GPU: 0, L1: 0, L2: chunks * CHUNK} and stats.failed_loads == 0
    assert again.engine.num_prefill_tokens == len(b3) - chunks * CHUNK
    settle(tiers_of(again), close=True)
