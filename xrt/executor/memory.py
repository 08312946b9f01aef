"""What the runner measures to size its KV cache: the peak activation bytes of the largest prefill step the scheduler
can build, run through the model on a scratch KV cache before the real one exists (xrt.kvcache.sizing turns it
into pages). The runner owns this sequence: load -> warm up (this run) -> size -> allocate -> capture."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from xrt.attention.metadata import AttentionMetadata
from xrt.config import XrtConfig
from xrt.executor.step import SeqChunk, StepInput
from xrt.kvcache.device import KVLayer, KVLayout, scratch_kv_cache


class ProfiledRunner(Protocol):
    """What measuring needs of the runner: the model's attention layers and an eager forward pass (one that takes
    no KV loads: there is no KV cache yet)."""

    device: torch.device
    page_size: int
    max_model_len: int
    attention_layers: Sequence[KVLayer]
    kv_layout: KVLayout

    def prepare(self, step: StepInput) -> tuple[torch.Tensor, AttentionMetadata]: ...

    def run_model(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor: ...


def profile_step(max_batched_tokens: int, max_num_seqs: int, max_model_len: int, page_size: int) -> StepInput:
    """The largest prefill the scheduler can build: max_batched_tokens split into sequences of at
    most max_model_len tokens (at most max_num_seqs of them), each wanting logits, on disjoint pages."""
    lengths: list[int] = []
    left = max_batched_tokens
    while left > 0 and len(lengths) < max_num_seqs:
        lengths.append(min(left, max_model_len))
        left -= lengths[-1]
    seqs, first_page = [], 0
    for n in lengths:
        pages = math.ceil(n / page_size)
        seqs.append(SeqChunk(token_ids=[0] * n, start_pos=0, page_table=list(range(first_page, first_page + pages))))
        first_page += pages
    return StepInput(is_prefill=True, seqs=seqs)


def peak_activation_bytes(cfg: XrtConfig, runner: ProfiledRunner) -> int:
    """Run the largest prefill through the runner on a scratch KV cache (one tensor shared by every
    layer; values do not matter) and return the peak of torch allocations above the baseline."""
    step = profile_step(
        cfg.scheduler.max_batched_tokens, cfg.scheduler.max_num_seqs, runner.max_model_len, runner.page_size
    )
    num_pages = sum(len(s.page_table) for s in step.seqs)

    def run() -> None:
        with torch.inference_mode():
            runner.run_model(*runner.prepare(step)).float()  # as a step returns them

    return peak_bytes_on_scratch_cache(runner, num_pages, run)


def peak_bytes_on_scratch_cache(runner: ProfiledRunner, num_pages: int, run: Callable[[], object]) -> int:
    """Peak torch allocations of `run()` above the baseline, with every attention layer pointed at one
    scratch KV cache of `num_pages` pages (the real cache, if any, is left untouched)."""
    device = runner.device
    try:
        with scratch_kv_cache(runner.attention_layers, runner.kv_layout, num_pages, device):
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            run()
            torch.cuda.synchronize(device)
            return torch.cuda.max_memory_allocated(device) - base
    finally:
        torch.cuda.empty_cache()
