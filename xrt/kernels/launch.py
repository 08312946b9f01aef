"""Launch sizing shared by the kernels: block widths and warp counts picked from static shapes only,
so a kernel compiles once per model shape and never inside a CUDA graph capture. Cached: the same few
model widths are asked for on every launch."""

from __future__ import annotations

import functools

import triton


@functools.cache
def block_size(n: int) -> int:
    """The power-of-two block that covers n elements (masked past n)."""
    return triton.next_power_of_2(max(int(n), 1))


@functools.cache
def num_warps_for(block: int, max_warps: int = 16) -> int:
    # About 8 elements per thread: 16-byte vector accesses for bf16/fp16 without register spills.
    return max(1, min(max_warps, block // 256))
