"""The tiered manager on CUDA, where gathers to L1 run on a side stream and are published only when this
thread sees their event done: a prefix whose chunks are still being gathered is loaded once they are, not
waited for as if another thread would publish them. Written on a CPU machine (tests/README.md: --gpu)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import attrs
import torch
from test_tiered_engine import CHUNK, cache, outputs, prompts, tiers_of

from xrt.config import Device, KVTiers, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.stats import L1


def test_a_prefix_still_being_gathered(device: torch.device, diverse_cfg: Callable[..., XrtConfig],
                                       tmp_path: Path) -> None:
    def on_cuda(tiers: KVTiers) -> XrtConfig:
        return attrs.evolve(diverse_cfg(cache=cache(tiers, tmp_path)), device=Device.CUDA)

    want = outputs(LLM(on_cuda(KVTiers.GPU)), [prompts(0)[2]])
    llm = LLM(on_cuda(KVTiers.L1))
    tiers = tiers_of(llm)
    assert tiers.copier.stream is not None
    with torch.cuda.stream(tiers.copier.stream):
        torch.cuda._sleep(int(2e10))  # ~10 s at 2 GHz: the next gathers queue behind it
    outputs(llm, [prompts(0)[0]])
    assert tiers._gathers  # still running
    tiers.evict()
    start = time.perf_counter()
    assert outputs(llm, [prompts(0)[2]]) == want
    assert time.perf_counter() - start < 60  # not the 600 s a wait for a publish from elsewhere would take
    assert tiers.stats.hit_tokens[L1] == 5 * CHUNK
