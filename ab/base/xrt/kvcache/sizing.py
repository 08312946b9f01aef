"""How many KV pages the device cache gets. `cache.num_pages` when set; on CPU what `cache.kv_size_gb`
holds; on CUDA the process may use cache.max_memory_utilization of the GPU's total memory and the KV cache
gets what is left after the weights (and everything else already resident) and the peak activations of the
largest prefill step, measured by running one. Then, either way, less what something built after the cache
reserves (the prefill CUDA graphs' memory pool and buffers). A cache the user sized (`cache.num_pages`, or
`cache.kv_size_gb` on CPU) must fit the memory available now, checked before allocating, so a too-large
one is one line naming the field rather than an allocator error (or, with overcommit, the OOM killer)."""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from xrt.config import XrtConfig
from xrt.executor.step import SeqChunk, StepInput
from xrt.kvcache.device import KVLayer, KVLayout, scratch_kv_cache
from xrt.log import get_logger
from xrt.units import GB, GiB

log = get_logger(__name__)


class ProfiledRunner(Protocol):
    """What sizing needs of the runner: the model's attention layers and a step to run through it."""

    device: torch.device
    page_size: int
    max_model_len: int
    attention_layers: Sequence[KVLayer]
    kv_layout: KVLayout

    def execute(self, step: StepInput) -> torch.Tensor: ...


@dataclass(frozen=True)
class KVReserve:
    """Device memory the KV cache leaves to something built after it.
    holder: what gets it, for the log line; error: the message when it leaves no page."""

    bytes: int
    holder: str
    error: str


def num_pages(cfg: XrtConfig, runner: ProfiledRunner, reserve: Callable[[], KVReserve] | None = None) -> int:
    cache = cfg.cache
    bytes_per_page = runner.kv_layout.bytes_per_page
    if cache.num_pages:
        check_fits(cache.num_pages, bytes_per_page, runner.device, "cache.num_pages", f"{cache.num_pages} pages")
        return cache.num_pages
    if runner.device.type == "cuda":
        pages = cuda_num_pages(cfg, runner, bytes_per_page)
    else:
        pages = math.floor(cache.kv_size_gb * GB / bytes_per_page)
        check_fits(pages, bytes_per_page, runner.device, "cache.kv_size_gb", f"{cache.kv_size_gb} GB")
    if pages < 1:
        raise ValueError(
            f"cache.kv_size_gb: {cache.kv_size_gb} GB holds no {bytes_per_page}-byte KV page; "
            f"raise it or set cache.num_pages"
        )
    return pages if reserve is None else leave_reserve(pages, bytes_per_page, reserve())


def check_fits(pages: int, bytes_per_page: int, device: torch.device, field: str, given: str) -> None:
    """ValueError naming `field` when `pages` KV pages need more memory than `device` has available."""
    available = available_bytes(device)
    need = pages * bytes_per_page
    if available is not None and need > available:
        where = "free device" if device.type == "cuda" else "available host"
        raise ValueError(
            f"{field}: {given} of KV cache ({need / GiB:.2f} GiB, {bytes_per_page} B/page) is more than the "
            f"{available / GiB:.2f} GiB of {where} memory; lower {field}"
        )


def available_bytes(device: torch.device) -> int | None:
    """Bytes a new allocation on `device` can take now; None when it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return host_available_bytes()


def host_available_bytes() -> int | None:
    """MemAvailable (free memory plus the page cache the kernel can drop), capped by the cgroup's limit:
    in a container /proc/meminfo shows the host's memory, not what the container may use."""
    available: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None and hasattr(os, "sysconf"):
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            pass
    left = _cgroup_left()
    if left is not None:
        available = left if available is None else min(available, left)
    return available


def _cgroup_left() -> int | None:
    """The cgroup's memory limit less its working set (usage less the inactive page cache, which the kernel
    reclaims first: a checkpoint just read is charged to the cgroup but does not hold memory); v2, then v1.
    None without a limit."""
    for base, limit_name, usage_name, inactive_key in (
        ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    ):
        try:
            with open(os.path.join(base, limit_name)) as f:
                limit = f.read().strip()
            with open(os.path.join(base, usage_name)) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        # v2 writes "max" for no limit; v1 a number near 2**63.
        if not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        return max(int(limit) - usage + _stat(os.path.join(base, "memory.stat"), inactive_key), 0)
    return None


def _stat(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def leave_reserve(pages: int, bytes_per_page: int, reserve: KVReserve) -> int:
    cut = -(-reserve.bytes // bytes_per_page)
    log.info(f"KV cache: {cut} of {pages} pages ({reserve.bytes / GiB:.2f} GiB) left to {reserve.holder}")
    if pages - cut < 1:
        raise ValueError(reserve.error)
    return pages - cut


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


def device_used_bytes(device: torch.device) -> tuple[int, int]:
    """(bytes in use on the device by anyone, total bytes), after returning torch's cached blocks."""
    # A runner dropped earlier in this process (a second LLM, a sweep's next job) is often held only by
    # reference cycles (runner <-> graph managers); until a collection its KV cache counts as in use here
    # (seen on the H200: 125 GiB "in use" for the second runner of one process).
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return total - free, total


def cuda_num_pages(cfg: XrtConfig, runner: ProfiledRunner, bytes_per_page: int) -> int:
    util = cfg.cache.max_memory_utilization
    peak = peak_activation_bytes(cfg, runner)
    # Measured after the profile so memory it brought in for good (cuBLAS workspaces, JIT kernels) counts.
    used, total = device_used_bytes(runner.device)
    budget = int(total * util)
    kv_bytes = budget - used - peak
    pages = kv_bytes // bytes_per_page if kv_bytes > 0 else 0
    log.info(
        f"KV cache: {util:.2f} x {total / GiB:.1f} GiB = {budget / GiB:.2f} GiB; in use after weights "
        f"{used / GiB:.2f} GiB; peak activations {peak / GiB:.2f} GiB "
        f"({cfg.scheduler.max_batched_tokens}-token prefill); KV {max(kv_bytes, 0) / GiB:.2f} GiB = {pages} pages "
        f"of {runner.page_size} tokens ({pages * runner.page_size} tokens, {bytes_per_page} B/page)"
    )
    if pages < 1:
        raise ValueError(
            f"cache.max_memory_utilization: {util} of {total / GiB:.1f} GiB leaves no room for the KV cache "
            f"(in use {used / GiB:.2f} GiB, peak activations {peak / GiB:.2f} GiB); raise it, lower "
            f"scheduler.max_batched_tokens, or set cache.num_pages"
        )
    return int(pages)
