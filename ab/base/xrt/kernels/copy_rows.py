"""Row copies by a fixed number of programs: `copy_rows(dst, src, programs)` copies src [rows, width] into dst (same
shape; each row contiguous, any row stride), each program looping over tiles of the rows.

Why a kernel with a bounded grid: the KV tiers move chunks between the device KV pages and pinned host memory
(L1) while the model computes. A DMA copy queues on the copy engine, in order with the steps' own small
copies (a read-back of sampled tokens waited behind a prompt's 940 MB of gathers on the H200); an elementwise
copy kernel sized by its element count fills every SM with blocks that mostly wait on PCIe, so the compute
stream's kernels wait for SMs to free up (a sampler behind 32 such copies ran ~5 ms late). A few programs, each
with many bytes in flight, reach the bus's bandwidth while leaving the rest of the SMs to the model. Host memory
is reached through its device mapping (pinned memory is mapped at the same address on the device), so the same
kernel copies either way."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # 32-bit words per tile: 16 KB, two 16-byte accesses per thread at 8 warps
NUM_WARPS = 8


@triton.jit
def _copy_rows_kernel(dst_ptr, src_ptr, dst_stride, src_stride, width, tiles_per_row, num_tiles,
                      BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    for tile in range(pid, num_tiles, step):
        # int64 row offsets: a Qwen3-8B KV cache is past 2**31 words
        row = (tile // tiles_per_row).to(tl.int64)
        col = (tile % tiles_per_row) * BLOCK + offs
        mask = col < width
        # streamed once: keep neither side in the caches the model's kernels use
        x = tl.load(src_ptr + row * src_stride + col, mask=mask, eviction_policy="evict_first")
        tl.store(dst_ptr + row * dst_stride + col, x, mask=mask, cache_modifier=".cs")


def _words(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dim() != 2 or t.stride(1) != 1:
        raise ValueError(f"copy_rows: {name} must be 2-D with contiguous rows, got shape {tuple(t.shape)} "
                         f"strides {t.stride()}")
    row_bytes = t.shape[1] * t.element_size()
    if row_bytes % 4 or (t.stride(0) * t.element_size()) % 4 or t.data_ptr() % 4:
        raise ValueError(f"copy_rows: {name}'s rows must be 4-byte aligned multiples of 4 bytes")
    return t.view(torch.int32)


def copy_rows(dst: torch.Tensor, src: torch.Tensor, programs: int) -> None:
    """dst[:] = src on the current stream with at most `programs` programs (thread blocks)."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"copy_rows: dst {tuple(dst.shape)} {dst.dtype} and src {tuple(src.shape)} {src.dtype} differ")
    if programs < 1:
        raise ValueError(f"copy_rows: programs must be >= 1, got {programs}")
    d, s = _words(dst, "dst"), _words(src, "src")
    rows, width = s.shape
    if rows == 0 or width == 0:
        return
    tiles_per_row = triton.cdiv(width, BLOCK)
    num_tiles = rows * tiles_per_row
    _copy_rows_kernel[(min(programs, num_tiles),)](
        d, s, d.stride(0), s.stride(0), width, tiles_per_row, num_tiles, BLOCK=BLOCK, num_warps=NUM_WARPS)
