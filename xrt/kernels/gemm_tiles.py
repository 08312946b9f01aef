"""Pieces the prefill GEMMs with fused epilogues share (xrt/kernels/qkv_gemm.py, gate_up_gemm.py,
residual_gemm.py): the grouped order of output tiles, the K loops (one dot or two over each activation tile, by
pointer loads or tensor descriptors), and the RMSNorm prologue. The weights are a linear's, [N, K] contiguous; K is a
multiple of the K step (the wrappers check it).

The RMSNorm prologue (`executor.fuse_prefill_norms`): a program's K loop reads its rows whole, so it sums their
squares as it goes and multiplies each activation tile by the norm's weight before the dot; the rows' 1 / RMS is
known only after the loop, and scales the accumulator then (`rms_scale`). The product differs from normalising first
(`xrt.ops.reference.rms_norm` then the GEMM) by where the operand is rounded: x * w instead of x * w / RMS."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def check_norm_weight(what: str, norm_weight: torch.Tensor | None, hidden: int) -> None:
    """The RMSNorm prologue's weight, where a wrapper takes one: contiguous [hidden]."""
    if norm_weight is not None and (tuple(norm_weight.shape) != (hidden,) or norm_weight.stride(0) != 1):
        raise ValueError(f"{what} norm_weight: expected a contiguous [{hidden}], got {tuple(norm_weight.shape)}")


@triton.jit
def grouped_tile(pid, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Program pid's (token tile, column tile): GROUP_M token tiles walk each column tile together, so the programs
    running at once share weight tiles (and activation tiles) in L2."""
    width = GROUP_M * tiles_n
    first = (pid // width) * GROUP_M
    size = tl.minimum(tiles_m - first, GROUP_M)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def normed_operand(x, norm_ptr, k0, ss, BLOCK_K: tl.constexpr):
    """The RMSNorm prologue on one activation tile x [BLOCK_M, BLOCK_K] of columns k0...: (x * the norm's weight,
    rounded to x's dtype; ss + the rows' sums of squares)."""
    xf = x.to(tl.float32)
    w = tl.load(norm_ptr + k0 + tl.arange(0, BLOCK_K)).to(tl.float32)
    return (xf * w[None, :]).to(x.dtype), ss + tl.sum(xf * xf, axis=1)


@triton.jit
def rms_scale(acc, ss, K, eps):
    """The RMSNorm prologue's end: the accumulator's rows times 1 / RMS of their activation rows (ss over K)."""
    return acc * tl.rsqrt(ss / K + eps)[:, None]


@triton.jit
def single_dot(x_ptrs, w_ptrs, m_ok, n_ok, K, norm_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr, NORM: tl.constexpr, MASK_N: tl.constexpr):
    """x [BLOCK_M, K] @ w^T (w: a [BLOCK_N, K] row tile of the weight), an fp32 accumulator, and the rows' sums of
    squares of x as in `dual_dot`. MASK_N: mask the weight rows by n_ok (a tile that may reach past the output)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        if NORM:
            x, ss = normed_operand(x, norm_ptr, k0, ss, BLOCK_K)
        if MASK_N:
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        else:
            w = tl.load(w_ptrs)
        if DOT_FP32:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc, ss


@triton.jit
def dual_dot(x_ptrs, a_ptrs, b_ptrs, m_ok, n_ok, K, norm_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr, NORM: tl.constexpr):
    """x [BLOCK_M, K] @ a^T and @ b^T (a, b: [BLOCK_N, K] row tiles of the weight), fp32 accumulators, and the rows'
    sums of squares of x (zeros unless NORM: then x's tiles are multiplied by norm_ptr's weight first,
    `normed_operand`). The pointer tiles start at k = 0 and step BLOCK_K; m_ok [BLOCK_M] / n_ok [BLOCK_N] mask the
    rows past the tensors' ends. DOT_FP32: upcast 16-bit operands first (the CPU interpreter's dot multiplies them
    as bit patterns)."""
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
        if NORM:
            x, ss = normed_operand(x, norm_ptr, k0, ss, BLOCK_K)
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
    return acc_a, acc_b, ss


@triton.jit
def tma_dot(x_desc, w_desc, x_row, w_row, K, norm_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr, NORM: tl.constexpr):
    """`single_dot` with the operand tiles through tensor descriptors (Hopper's TMA: rows past the ends come in as
    zeros): x rows x_row.. and weight rows w_row.., over all of K."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = x_desc.load([x_row, k0])
        if NORM:
            x, ss = normed_operand(x, norm_ptr, k0, ss, BLOCK_K)
        w = w_desc.load([w_row, k0])
        if DOT_FP32:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, w.T, acc)
    return acc, ss


@triton.jit
def tma_dual_dot(x_desc, w_desc, x_row, a_row, b_row, K, norm_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr, NORM: tl.constexpr):
    """`dual_dot` with the operand tiles through tensor descriptors: x rows x_row.. against weight rows a_row.. and
    b_row.., over all of K."""
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = x_desc.load([x_row, k0])
        if NORM:
            x, ss = normed_operand(x, norm_ptr, k0, ss, BLOCK_K)
        a = w_desc.load([a_row, k0])
        b = w_desc.load([b_row, k0])
        if DOT_FP32:
            x = x.to(tl.float32)
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc_a = tl.dot(x, a.T, acc_a)
        acc_b = tl.dot(x, b.T, acc_b)
    return acc_a, acc_b, ss
