"""KV-cache size on CUDA: the process may use cache.max_memory_utilization of the GPU's total
memory; the KV cache gets what is left after the weights (and everything else already resident)
and the peak activations of the largest prefill step, measured by running one."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from xrt.config import XrtConfig
from xrt.executor.step import SeqChunk, StepInput

GB = 1 << 30


class ScratchHost(Protocol):
    device: torch.device
    dtype: torch.dtype
    page_size: int
    attention_layers: list[torch.nn.Module]


class ProfiledRunner(ScratchHost, Protocol):
    max_model_len: int

    def execute(self, step: StepInput) -> torch.Tensor: ...


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
    return peak_bytes_on_scratch_cache(runner, num_pages, lambda: runner.execute(step))


def peak_bytes_on_scratch_cache(host: ScratchHost, num_pages: int, run: Callable[[], object]) -> int:
    """Peak torch allocations of `run()` above the baseline, with every attention layer pointed at one
    scratch KV cache of `num_pages` pages (values do not matter; the real cache is left untouched)."""
    layers = host.attention_layers
    first = layers[0]
    scratch = torch.zeros(
        num_pages, 2, host.page_size, first.num_kv_heads, first.head_dim, dtype=host.dtype, device=host.device
    )
    saved = [layer.kv_cache for layer in layers]
    try:
        for layer in layers:
            layer.kv_cache = scratch
        torch.cuda.synchronize(host.device)
        torch.cuda.reset_peak_memory_stats(host.device)
        base = torch.cuda.memory_allocated(host.device)
        run()
        torch.cuda.synchronize(host.device)
        return torch.cuda.max_memory_allocated(host.device) - base
    finally:
        for layer, kv in zip(layers, saved, strict=True):
            layer.kv_cache = kv
        del scratch
        torch.cuda.empty_cache()


def device_used_bytes(device: torch.device) -> tuple[int, int]:
    """(bytes in use on the device by anyone, total bytes), after returning torch's cached blocks."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return total - free, total


def cuda_num_pages(cfg: XrtConfig, runner: ProfiledRunner, bytes_per_page: int) -> int:
    util = cfg.cache.max_memory_utilization
    if not hasattr(runner, "backend"):
        # The profiling step plans attention; the runner may size the cache before building its backend.
        runner.backend = runner._make_backend()  # type: ignore[attr-defined]
    peak = peak_activation_bytes(cfg, runner)
    # Measured after the profile so memory it brought in for good (cuBLAS workspaces, JIT kernels) counts.
    used, total = device_used_bytes(runner.device)
    budget = int(total * util)
    kv_bytes = budget - used - peak
    pages = kv_bytes // bytes_per_page if kv_bytes > 0 else 0
    print(
        f"[xrt] KV cache: {util:.2f} x {total / GB:.1f} GiB = {budget / GB:.2f} GiB; in use after weights "
        f"{used / GB:.2f} GiB; peak activations {peak / GB:.2f} GiB "
        f"({cfg.scheduler.max_batched_tokens}-token prefill); KV {max(kv_bytes, 0) / GB:.2f} GiB = {pages} pages "
        f"of {runner.page_size} tokens ({pages * runner.page_size} tokens, {bytes_per_page} B/page)",
        flush=True,
    )
    if pages < 1:
        raise ValueError(
            f"cache.max_memory_utilization: {util} of {total / GB:.1f} GiB leaves no room for the KV cache "
            f"(in use {used / GB:.2f} GiB, peak activations {peak / GB:.2f} GiB); raise it, lower "
            f"scheduler.max_batched_tokens, or set cache.num_pages"
        )
    return int(pages)
