"""How many KV pages the device cache gets: the bytes-to-pages arithmetic (the runner measures what it needs,
xrt/executor/memory.py). `cache.num_pages` when set; on CPU what `cache.kv_size_gb` holds; on CUDA the process
may use cache.max_memory_utilization of the GPU's total memory and the KV cache gets what is left after the
weights (and everything else already resident) and the peak activations of the largest prefill step. Then,
either way, less what something built after the cache reserves (the prefill CUDA graphs' memory pool and
buffers). A cache the user sized (`cache.num_pages`, or `cache.kv_size_gb` on CPU) must fit the memory available
now, checked before allocating, so a too-large one is one line naming the field rather than an allocator error
(or, with overcommit, the OOM killer). A cache sized from GPU memory is capped at cache.max_pages_over_need times
the pages the running sequences can fill: beyond those, pages only hold prefix-cache entries, and a small model on
a large GPU would otherwise get millions of pages, seconds to allocate and zero at start-up."""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from xrt.config import XrtConfig
from xrt.log import get_logger
from xrt.units import GB, GiB

log = get_logger(__name__)


@dataclass(frozen=True)
class KVReserve:
    """Device memory the KV cache leaves to something built after it.
    holder: what gets it, for the log line; error: the message when it leaves no page."""

    bytes: int
    holder: str
    error: str


def num_pages(cfg: XrtConfig, bytes_per_page: int, device: torch.device, peak_bytes: Callable[[], int],
              reserve: Callable[[], KVReserve] | None = None) -> int:
    """The pages the config gives a KV cache of `bytes_per_page` pages on `device`. peak_bytes: the peak activation
    bytes of the largest prefill step, measured by the caller (the runner runs one; only asked on CUDA, when the
    config does not fix the size)."""
    cache = cfg.cache
    if cache.num_pages:
        check_fits(cache.num_pages, bytes_per_page, device, "cache.num_pages", f"{cache.num_pages} pages")
        return cache.num_pages
    cap = None
    if device.type == "cuda":
        pages = cuda_num_pages(cfg, device, bytes_per_page, peak_bytes())
        cap = page_cap(cfg)
    else:
        pages = math.floor(cache.kv_size_gb * GB / bytes_per_page)
        check_fits(pages, bytes_per_page, device, "cache.kv_size_gb", f"{cache.kv_size_gb} GB")
    if pages < 1:
        raise ValueError(
            f"cache.kv_size_gb: {cache.kv_size_gb} GB holds no {bytes_per_page}-byte KV page; "
            f"raise it or set cache.num_pages"
        )
    pages = pages if reserve is None else leave_reserve(pages, bytes_per_page, reserve())
    # After the reserve: what is built after the cache comes out of memory; the cap only bounds what the cache keeps.
    return pages if cap is None else min(pages, cap)


def pages_needed(cfg: XrtConfig) -> int:
    """The pages scheduler.max_num_seqs sequences of model.max_model_len tokens fill (each may reach max_model_len + 1
    KV slots, in whole pages): the most the running sequences can hold at once."""
    per_seq = -(-(cfg.model.max_model_len + 1) // cfg.cache.page_size)
    return cfg.scheduler.max_num_seqs * per_seq


def page_cap(cfg: XrtConfig) -> int | None:
    """The most pages a cache sized from GPU memory gets (cache.max_pages_over_need x `pages_needed`); None: no cap."""
    factor = cfg.cache.max_pages_over_need
    return math.ceil(factor * pages_needed(cfg)) if factor > 0 else None


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


def cuda_num_pages(cfg: XrtConfig, device: torch.device, bytes_per_page: int, peak: int) -> int:
    util = cfg.cache.max_memory_utilization
    # Measured after the peak (the caller's profile step) so memory it brought in for good (cuBLAS workspaces,
    # JIT kernels) counts.
    used, total = device_used_bytes(device)
    budget = int(total * util)
    kv_bytes = budget - used - peak
    pages = kv_bytes // bytes_per_page if kv_bytes > 0 else 0
    page_size = cfg.cache.page_size
    cap = page_cap(cfg)
    capped = ""
    if cap is not None and pages > cap:
        capped = (f"; capped at {cap} pages ({cap * bytes_per_page / GiB:.2f} GiB): cache.max_pages_over_need="
                  f"{cfg.cache.max_pages_over_need:g} x the {pages_needed(cfg)} pages {cfg.scheduler.max_num_seqs} "
                  f"sequences of {cfg.model.max_model_len} tokens fill")
    log.info(
        f"KV cache: {util:.2f} x {total / GiB:.1f} GiB = {budget / GiB:.2f} GiB; in use after weights "
        f"{used / GiB:.2f} GiB; peak activations {peak / GiB:.2f} GiB "
        f"({cfg.scheduler.max_batched_tokens}-token prefill); KV {max(kv_bytes, 0) / GiB:.2f} GiB = {pages} pages "
        f"of {page_size} tokens ({pages * page_size} tokens, {bytes_per_page} B/page){capped}"
    )
    if pages < 1:
        raise ValueError(
            f"cache.max_memory_utilization: {util} of {total / GiB:.1f} GiB leaves no room for the KV cache "
            f"(in use {used / GiB:.2f} GiB, peak activations {peak / GiB:.2f} GiB); raise it, lower "
            f"scheduler.max_batched_tokens, or set cache.num_pages"
        )
    return int(pages)
