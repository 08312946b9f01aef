"""Pieces the prefill GEMMs with fused epilogues share (xrt/kernels/qkv_gemm.py, gate_up_gemm.py): the grouped
order of output tiles and the K loop of two dots over one activation tile. The weights are a linear's, [N, K]
contiguous; K is a multiple of the K step (the wrappers check it)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Program pid's (token tile, column tile): GROUP_M token tiles walk each column tile together, so the programs
    running at once share weight tiles (and activation tiles) in L2."""
    width = GROUP_M * tiles_n
    first = (pid // width) * GROUP_M
    size = tl.minimum(tiles_m - first, GROUP_M)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def dual_dot(x_ptrs, a_ptrs, b_ptrs, m_ok, n_ok, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    """x [BLOCK_M, K] @ a^T and @ b^T (a, b: [BLOCK_N, K] row tiles of the weight), fp32 accumulators. The pointer
    tiles start at k = 0 and step BLOCK_K; m_ok [BLOCK_M] / n_ok [BLOCK_N] mask the rows past the tensors' ends.
    DOT_FP32: upcast 16-bit operands first (the CPU interpreter's dot multiplies them as bit patterns)."""
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        a = tl.load(a_ptrs, mask=n_ok[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=n_ok[:, None], other=0.0)
        if DOT_FP32:
            x = x.to(tl.float32)
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc_a = tl.dot(x, tl.trans(a), acc_a)
        acc_b = tl.dot(x, tl.trans(b), acc_b)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    return acc_a, acc_b
