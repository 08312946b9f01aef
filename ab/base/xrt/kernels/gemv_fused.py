"""The skinny GEMM (xrt.kernels.gemv) with its input computed while it is loaded, so the small elementwise
kernel that would produce it (1-2 us of launch and ramp at decode batch sizes, for almost no work) is gone:

- silu_and_mul_gemv: y = (silu(gate_up[:, :K]) * gate_up[:, K:]) @ w[N, K]^T (the MLP's down projection);
- add_rms_norm_gemv: h = x + residual, y = rms_norm(h) * norm_w @ w[N, K]^T, and h written to a new buffer (a
  norm followed by the qkv or gate_up projection).

The prologue's x is computed in fp32 from the 16-bit inputs and rounded to their dtype, exactly as the unfused
kernel's output would be stored (silu_and_mul.py, rms_norm.py), then multiplied like gemv's. Every program
computes the x of its own rows and K range (the rows are tiny and come from L2), for the norm after the sum of
squares of its rows over all of K; h is stored by one program per M tile, at its end, since the others still
read x and residual. The FMA and tensor-core loops, split-K with its self-resetting arrival counters and the
output epilogue are gemv's; the configs are chosen for the prologue's cost (pick_fused_config)."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from xrt.kernels.gemv import (
    _TARGET_PROGRAMS,
    GemvConfig,
    _fma_fits,
    _fma_rows_to_tile,
    _split_counters,
    _store_tile,
    check_config,
)
from xrt.kernels.launch import pdl, pdl_enter, pdl_launch

SILU_AND_MUL = 1
ADD_RMS_NORM = 2
# FMA accumulators per thread, so that the prologue's operands fit beside them in registers (ptxas for sm_90:
# the picked 16-bit configs of the 0.6B shapes take 40-56 registers; gemv's 4 x 4 tile at K = 3072, with 128,
# spills 624 bytes fused).
_FUSED_FMA_ACC = 64
# Output columns per tensor-core program.
_FUSED_DOT_BLOCK_N = 64


def _fused_split(K: int, block_k: int, tiles: int) -> int:
    """The fewest even K splits that bring the programs up to half of gemv's target (all K steps if none does)."""
    steps = triton.cdiv(K, block_k)
    want = triton.cdiv(_TARGET_PROGRAMS // 2, tiles)
    return min((d for d in range(1, steps + 1) if steps % d == 0 and d >= want), default=steps)


@functools.lru_cache(maxsize=4096)
def pick_fused_config(M: int, N: int, K: int) -> GemvConfig:
    """Fixed config of the fused kernels for a shape (not measured on the H200 yet). Every N tile recomputes the
    prologue of its rows over its K range (the silu's sigmoid runs on the SFUs, at 1/8 of the FMA rate; the
    norm reads its rows twice), so that work grows with M x (N tiles) where gemv's measured picks favour narrow
    tiles: here N tiles are as wide as the registers allow and K is split to keep the programs in flight.
    M = 1: the FMA path with gemv's heuristic K step (up to 1024, so a program of K <= 1024 loads all its
    weights before the norm's reduction) and up to _FUSED_FMA_ACC accumulators a thread; larger M: the
    tensor-core path with 16 x 64 tiles (the FMA path at M = 4 would redo the silu for every 2 columns)."""
    if M == 1:
        block_k = min(triton.next_power_of_2(K), 1024)
        num_warps = max(1, min(4, block_k // 256))
        block_n = max(1, min(_FUSED_FMA_ACC * 32 * num_warps // block_k, triton.next_power_of_2(N)))
        while True:
            split = _fused_split(K, block_k, triton.cdiv(N, block_n))
            cfg = GemvConfig(1, block_n, block_k, num_warps, split)
            if block_n == 1 or _fma_fits(cfg, K):
                return cfg
            block_n //= 2
    block_k = max(16, min(triton.next_power_of_2(K), 128))
    block_n = max(16, min(_FUSED_DOT_BLOCK_N, triton.next_power_of_2(N)))
    tiles = triton.cdiv(M, 16) * triton.cdiv(N, block_n)
    return GemvConfig(16, block_n, block_k, 4, _fused_split(K, block_k, tiles), use_dot=True, num_stages=3)


@triton.jit
def _prologue_x(a, b, nw, rstd, PROLOGUE: tl.constexpr, dtype: tl.constexpr):
    """x from the fp32 operand tiles a and b, rounded to dtype: silu(a) * b, or the norm of h = a + b (h
    rounded to dtype first, as the unfused kernel stores the residual) with rstd and norm weight nw."""
    if PROLOGUE == 1:
        x = a * tl.sigmoid(a) * b
    else:
        h = (a + b).to(dtype).to(tl.float32)
        x = h * rstd * nw
    return x.to(dtype)


@triton.jit
def _load_nw(nw_ptr, k, EVEN_K: tl.constexpr, K: tl.constexpr, PROLOGUE: tl.constexpr):
    """The norm weight at k (fp32) for the norm prologue; unused otherwise."""
    if PROLOGUE == 2:
        if EVEN_K:
            nw = tl.load(nw_ptr + k).to(tl.float32)
        else:
            nw = tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32)
    else:
        nw = 0.0
    return nw


@triton.jit
def _x_row(
    a_ptr, b_ptr, row, M, stride_am, stride_bm, k, nw, rstd,
    EVEN_K: tl.constexpr, K: tl.constexpr, PROLOGUE: tl.constexpr,
):
    """x[row, k] as a [1, BLOCK_K] fp32 tile, like gemv's _load_x_row: rows past M read row M - 1."""
    r = tl.minimum(row, M - 1).to(tl.int64)
    if EVEN_K:
        a = tl.load(a_ptr + r * stride_am + k)
        b = tl.load(b_ptr + r * stride_bm + k)
    else:
        a = tl.load(a_ptr + r * stride_am + k, mask=k < K, other=0.0)
        b = tl.load(b_ptr + r * stride_bm + k, mask=k < K, other=0.0)
    x = _prologue_x(a.to(tl.float32), b.to(tl.float32), nw, rstd, PROLOGUE, a_ptr.dtype.element_ty)
    return x.to(tl.float32)


@triton.jit
def _rms_sumsq(a_ptr, b_ptr, rows, m_mask, stride_am, stride_bm, k, K: tl.constexpr):
    """Sum over k of h^2, h = a + b rounded to the dtype, per row: [BLOCK_M] fp32."""
    mask = m_mask[:, None] & (k < K)
    a = tl.load(a_ptr + rows * stride_am + k, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows * stride_bm + k, mask=mask, other=0.0).to(tl.float32)
    h = (a + b).to(a_ptr.dtype.element_ty).to(tl.float32)
    return tl.sum(h * h, axis=1)


@triton.jit
def _rms_rstd(
    a_ptr, b_ptr, rm, m_mask, stride_am, stride_bm, eps,
    K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, UNROLL: tl.constexpr,
):
    """1 / rms of h = a + b (rounded to the dtype) for each row of the tile over all of K, [BLOCK_M] fp32
    (rows past M: rsqrt(eps), never used). UNROLL (the FMA path, itself unrolled) gives the compiler one
    straight run of code in which to issue the weight loads early."""
    rows = rm.to(tl.int64)[:, None]
    rk = tl.arange(0, BLOCK_K)
    sumsq = tl.zeros([BLOCK_M], dtype=tl.float32)
    if UNROLL:
        for kk in tl.static_range(0, K, BLOCK_K):
            sumsq += _rms_sumsq(a_ptr, b_ptr, rows, m_mask, stride_am, stride_bm, (kk + rk)[None, :], K)
    else:
        for kk in range(0, K, BLOCK_K):
            sumsq += _rms_sumsq(a_ptr, b_ptr, rows, m_mask, stride_am, stride_bm, (kk + rk)[None, :], K)
    return tl.rsqrt(sumsq / K + eps)


@triton.jit
def _store_h(
    a_ptr, b_ptr, res_ptr, rm, m_mask, stride_am, stride_bm, stride_rm, K: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """h = a + b (rounded to the dtype) into res, for the tile's rows."""
    rows = rm.to(tl.int64)[:, None]
    rk = tl.arange(0, BLOCK_K)
    for kk in range(0, K, BLOCK_K):
        k = (kk + rk)[None, :]
        mask = m_mask[:, None] & (k < K)
        a = tl.load(a_ptr + rows * stride_am + k, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + rows * stride_bm + k, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + rows * stride_rm + k, (a + b).to(res_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_w(w_rows, k, n_mask, EVEN_K: tl.constexpr, K: tl.constexpr):
    """The FMA path's [BLOCK_N, BLOCK_K] weight tile at k, fp32."""
    if EVEN_K:
        w = tl.load(w_rows + k, mask=n_mask[:, None], other=0.0)
    else:
        w = tl.load(w_rows + k, mask=n_mask[:, None] & (k < K), other=0.0)
    return w.to(tl.float32)


@triton.jit
def _fma_step(
    acc0, acc1, acc2, acc3, w, a_ptr, b_ptr, nw_ptr, row0, M, stride_am, stride_bm, k, rstd0, rstd1, rstd2, rstd3,
    EVEN_K: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, PROLOGUE: tl.constexpr,
):
    """One K step of gemv's FMA loop, each row's x computed by the prologue."""
    nw = _load_nw(nw_ptr, k, EVEN_K, K, PROLOGUE)
    acc0 += w * _x_row(a_ptr, b_ptr, row0 + 0, M, stride_am, stride_bm, k, nw, rstd0, EVEN_K, K, PROLOGUE)
    if BLOCK_M > 1:
        acc1 += w * _x_row(a_ptr, b_ptr, row0 + 1, M, stride_am, stride_bm, k, nw, rstd1, EVEN_K, K, PROLOGUE)
    if BLOCK_M > 2:
        acc2 += w * _x_row(a_ptr, b_ptr, row0 + 2, M, stride_am, stride_bm, k, nw, rstd2, EVEN_K, K, PROLOGUE)
    if BLOCK_M > 3:
        acc3 += w * _x_row(a_ptr, b_ptr, row0 + 3, M, stride_am, stride_bm, k, nw, rstd3, EVEN_K, K, PROLOGUE)
    return acc0, acc1, acc2, acc3


@triton.jit
def _row_of(v, i: tl.constexpr, BLOCK_M: tl.constexpr):
    """Element i of a [BLOCK_M] vector, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, BLOCK_M) == i, v, 0.0), axis=0)


@triton.jit(do_not_specialize=["M"])
def _gemv_prologue_kernel(
    a_ptr,
    b_ptr,
    nw_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    stride_am,
    stride_bm,
    stride_rm,
    stride_wn,
    stride_om,
    eps,
    K: tl.constexpr,
    K_SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PROLOGUE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # a, b and the split-K counters belong to the kernels before
    # gemv's _gemv_kernel with x = prologue(a, b) (module docstring); a and b are [M, K] row sets: gate and up
    # (halves of one gate_up row), or x and residual (res: where h = x + residual goes).
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    m_tile = pid % m_tiles
    rest = pid // m_tiles
    k_split = rest % SPLIT_K
    n_tile = rest // SPLIT_K

    rm = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    n_mask = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    k_base = k_split * K_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    dtype = a_ptr.dtype.element_ty

    if USE_DOT:
        if PROLOGUE == 2:
            rstd = _rms_rstd(a_ptr, b_ptr, rm, m_mask, stride_am, stride_bm, eps, K, BLOCK_M, BLOCK_K, False)
        else:
            rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
        a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am
        b_rows = b_ptr + rm.to(tl.int64)[:, None] * stride_bm
        for kk in range(0, K_SPLIT, BLOCK_K):
            k = k_base + kk + rk
            if EVEN_K:
                a = tl.load(a_rows + k[None, :], mask=m_mask[:, None], other=0.0)
                b = tl.load(b_rows + k[None, :], mask=m_mask[:, None], other=0.0)
                w = tl.load(w_rows + k[None, :], mask=n_mask[:, None], other=0.0)
            else:
                k_mask = k < K
                a = tl.load(a_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
                b = tl.load(b_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
                w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            nw = _load_nw(nw_ptr, k[None, :], EVEN_K, K, PROLOGUE)
            x = _prologue_x(a.to(tl.float32), b.to(tl.float32), nw, rstd[:, None], PROLOGUE, dtype)
            if DOT_FP32:
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    else:
        # The first K step's weights are requested before the norm's reduction (a barrier; the compiler does not
        # move loads above it), so that their memory latency overlaps it: all the weights when the program has
        # one K step, as pick_fused_config gives M = 1 wherever it can.
        row0 = m_tile * BLOCK_M
        k = (k_base + rk)[None, :]
        w = _load_w(w_rows, k, n_mask, EVEN_K, K)
        if PROLOGUE == 2:
            rstd = _rms_rstd(a_ptr, b_ptr, rm, m_mask, stride_am, stride_bm, eps, K, BLOCK_M, BLOCK_K, True)
            rstd0 = _row_of(rstd, 0, BLOCK_M)
            rstd1 = _row_of(rstd, 1, BLOCK_M) if BLOCK_M > 1 else 0.0
            rstd2 = _row_of(rstd, 2, BLOCK_M) if BLOCK_M > 2 else 0.0
            rstd3 = _row_of(rstd, 3, BLOCK_M) if BLOCK_M > 3 else 0.0
        else:
            rstd0, rstd1, rstd2, rstd3 = 0.0, 0.0, 0.0, 0.0
        acc0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc0, acc1, acc2, acc3 = _fma_step(acc0, acc1, acc2, acc3, w, a_ptr, b_ptr, nw_ptr, row0, M, stride_am,
                                           stride_bm, k, rstd0, rstd1, rstd2, rstd3, EVEN_K, K, BLOCK_M, PROLOGUE)
        for kk in tl.static_range(BLOCK_K, K_SPLIT, BLOCK_K):
            k = (k_base + kk + rk)[None, :]
            w = _load_w(w_rows, k, n_mask, EVEN_K, K)
            acc0, acc1, acc2, acc3 = _fma_step(acc0, acc1, acc2, acc3, w, a_ptr, b_ptr, nw_ptr, row0, M, stride_am,
                                               stride_bm, k, rstd0, rstd1, rstd2, rstd3, EVEN_K, K, BLOCK_M,
                                               PROLOGUE)
        acc = _fma_rows_to_tile(acc, acc0, acc1, acc2, acc3, BLOCK_M)

    _store_tile(acc, out_ptr, ws_ptr, cnt_ptr, rm, rn, m_mask, n_mask, M, N, stride_om,
                m_tile, n_tile, m_tiles, k_split, BLOCK_M, BLOCK_N, SPLIT_K)
    if PROLOGUE == 2:
        # Each M tile's rows are written once, by its first N tile's first K split (after its own product: no
        # store ahead of the weight loads): the other programs still read x and residual, so h cannot go back
        # into either.
        if n_tile + k_split == 0:
            _store_h(a_ptr, b_ptr, res_ptr, rm, m_mask, stride_am, stride_bm, stride_rm, K, BLOCK_K)


def _rows(name: str, t: torch.Tensor, k: int) -> torch.Tensor:
    """t as [M, k] rows with unit last stride (a copy only if its last stride is not 1)."""
    if t.dim() != 2 or t.shape[1] != k:
        raise ValueError(f"{name}: expected [M, {k}], got shape {tuple(t.shape)}")
    return t if t.stride(1) == 1 else t.contiguous()


def _check_weight(name: str, w: torch.Tensor, like: torch.Tensor) -> tuple[int, int]:
    if w.dim() != 2 or w.stride(1) != 1:
        raise ValueError(f"{name} w: expected [N, K] with unit last stride, got shape {tuple(w.shape)} "
                         f"strides {w.stride()}")
    if like.dtype != w.dtype or like.device != w.device:
        raise ValueError(f"{name}: inputs and w must share dtype and device, got {like.dtype} on {like.device} "
                         f"and {w.dtype} on {w.device}")
    return w.shape[0], w.shape[1]


def _launch(
    prologue: int,
    a: torch.Tensor,
    b: torch.Tensor,
    norm_weight: torch.Tensor | None,
    residual_out: torch.Tensor | None,
    w: torch.Tensor,
    eps: float,
    config: GemvConfig | None,
) -> torch.Tensor:
    """y [M, N] = prologue(a, b) @ w^T; a, b: [M, K] rows with unit last stride, M, N, K > 0."""
    (M, K), N = a.shape, w.shape[0]
    out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    cfg = config if config is not None else pick_fused_config(M, N, K)
    check_config(cfg)
    m_tiles, n_tiles = triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n)
    k_split = triton.cdiv(K, cfg.split_k * cfg.block_k) * cfg.block_k
    if cfg.split_k > 1:
        ws = torch.empty((cfg.split_k, M, N), dtype=torch.float32, device=a.device)
        cnt = _split_counters(a.device, m_tiles * n_tiles)
    else:
        ws, cnt = out, out  # dead arguments: SPLIT_K == 1 is a constexpr
    # Dead arguments without the norm (PROLOGUE is a constexpr).
    nw = norm_weight if norm_weight is not None else a
    res = residual_out if residual_out is not None else out
    interpret_bf16 = a.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    # One-row strides are never read: fixed values keep one compiled specialization for every M (as gemv).
    single = M == 1
    on = pdl(a, M)
    _gemv_prologue_kernel[(m_tiles * n_tiles * cfg.split_k,)](
        a, b, nw, res, w, out, ws, cnt, M, N,
        K if single else a.stride(0), K if single else b.stride(0), K if single else res.stride(0),
        w.stride(0), N if single else out.stride(0), eps,
        K=K, K_SPLIT=k_split, EVEN_K=k_split * cfg.split_k == K,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        USE_DOT=cfg.use_dot, PRECISION="ieee" if interpret_bf16 or a.dtype == torch.float32 else "tf32",
        DOT_FP32=interpret_bf16, PROLOGUE=prologue, PDL=on,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(on),
    )
    return out


def silu_and_mul_gemv(gate_up: torch.Tensor, w: torch.Tensor, config: GemvConfig | None = None) -> torch.Tensor:
    """(silu(gate_up[:, :K]) * gate_up[:, K:]) @ w[N, K]^T -> [M, N] in gate_up's dtype, one launch."""
    N, K = _check_weight("silu_and_mul_gemv", w, gate_up)
    rows = _rows("silu_and_mul_gemv gate_up", gate_up, 2 * K)
    M = rows.shape[0]
    if M == 0 or N == 0:
        return rows.new_empty((M, N))
    if K == 0:
        return rows.new_zeros((M, N))
    return _launch(SILU_AND_MUL, rows[:, :K], rows[:, K:], None, None, w, 0.0, config)


def add_rms_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    w: torch.Tensor,
    config: GemvConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual; (rms_norm(h) * norm_weight @ w[N, K]^T, h), one launch. Both results are new
    tensors in x's dtype; x and residual are only read."""
    N, K = _check_weight("add_rms_norm_gemv", w, x)
    x_rows = _rows("add_rms_norm_gemv x", x, K)
    res_rows = _rows("add_rms_norm_gemv residual", residual, K)
    if res_rows.shape[0] != x_rows.shape[0] or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"add_rms_norm_gemv residual: expected {x_rows.shape[0]} rows of {x.dtype} on {x.device}, "
                         f"got {tuple(residual.shape)} {residual.dtype} on {residual.device}")
    if norm_weight.shape != (K,) or norm_weight.device != x.device:
        raise ValueError(f"add_rms_norm_gemv norm_weight: expected [{K}] on {x.device}, got "
                         f"{tuple(norm_weight.shape)} on {norm_weight.device}")
    M = x_rows.shape[0]
    if M == 0 or N == 0 or K == 0:
        return x_rows.new_zeros((M, N)), x_rows + res_rows
    residual_out = torch.empty((M, K), dtype=x.dtype, device=x.device)
    y = _launch(ADD_RMS_NORM, x_rows, res_rows, norm_weight.contiguous(), residual_out, w, eps, config)
    return y, residual_out
