"""Skinny GEMM for decode: y[M, N] = x[M, K] @ w[N, K]^T with w row-major as nn.Linear stores it, fp32
accumulation, output in x's dtype. Built for small M (1..16), where the cost is streaming w once from HBM;
correct for any M.

One program owns a [BLOCK_M, BLOCK_N] output tile (and, with split-K, one K slice of it). Two inner loops:
- FMA (USE_DOT False, M up to ~4): w tiles are read with wide vector loads along K and multiplied on the
  CUDA cores; the K loop is fully unrolled (K is a constexpr) so every load of the tile is in flight at once.
- tensor-core dot (USE_DOT True, M >= ~8): x padded to 16 rows; at M = 8..16 the FMA loop would be
  compute bound.
Split-K partials go to an fp32 workspace; the last program to finish a tile (an arrival counter per tile)
sums them in split order, writes the output and resets its counter, so one launch does all the work and
the result is deterministic.
Gated (`gated=True`, the MLP's gate_up projection): w is [gate; up] stacked, [2I, K], and the output is
silu(x @ gate^T) * (x @ up^T), [M, I]: a program's tile pairs gate row j with up row j, so the activation is its
epilogue and the separate silu_and_mul launch (and the round trip of the [M, 2I] product) goes.
Norm prologue (`norm=NormPrologue(...)`, FMA path only; the decoder layer's residual add and RMSNorm before qkv and
gate_up): x is the sublayer's output, and each program computes the residual sum s = x + residual (rounded to x's
dtype) of its rows and their 1 / RMS over all of K itself, multiplies x's tiles as rms_norm(s) * weight (rounded
as the fused_add_rms_norm kernel rounds them), and the first N tile's programs write s to `residual_out` (never to
`residual`, which the other programs are still reading): one launch where the norm kernel and the GEMV were two.
Configs are fixed per shape (`pick_config`, in xrt/kernels/gemv_configs.py), never
autotuned: every launch is capture-safe once each (M bucket, shape) has run eagerly once to compile it."""

from __future__ import annotations

import dataclasses
import os

import torch
import triton
import triton.language as tl

# The configs' names are this module's too (callers and tests import them from here).
from xrt.kernels.gemv_configs import _MEASURED as _MEASURED
from xrt.kernels.gemv_configs import GemvConfig as GemvConfig
from xrt.kernels.gemv_configs import _fma_fits as _fma_fits
from xrt.kernels.gemv_configs import candidate_configs as candidate_configs
from xrt.kernels.gemv_configs import check_config as check_config
from xrt.kernels.gemv_configs import heuristic_config as heuristic_config
from xrt.kernels.gemv_configs import pick_config as pick_config
from xrt.kernels.gemv_configs import prefer_gemv as prefer_gemv
from xrt.kernels.launch import pdl as launch_pdl
from xrt.kernels.launch import pdl_enter, pdl_launch

# Arrival counters per device for split-K; they reset themselves, so they are zeroed only when allocated.
_COUNTER_SLOTS = 1 << 16
_counters: dict[torch.device, list[torch.Tensor]] = {}


@triton.jit
def _load_x_row(x_ptr, row, M, stride_xm, k, EVEN_K: tl.constexpr, K: tl.constexpr):
    """x[row, k] as a [1, BLOCK_K] fp32 tile; rows past M read row M - 1 (valid memory, never stored)."""
    ptr = x_ptr + tl.minimum(row, M - 1).to(tl.int64) * stride_xm + k
    if EVEN_K:
        x = tl.load(ptr)
    else:
        x = tl.load(ptr, mask=k < K, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _row_rstd(x_ptr, res_ptr, row, M, stride_xm, stride_rm, eps, K: tl.constexpr, K_POW2: tl.constexpr):
    """1 / RMS of the residual sum s = x[row] + residual[row] over all K (s rounded to x's dtype first, as the
    fused_add_rms_norm kernel stores and then normalises it); rows past M read row M - 1."""
    r = tl.minimum(row, M - 1).to(tl.int64)
    k = tl.arange(0, K_POW2)
    mask = k < K
    x = tl.load(x_ptr + r * stride_xm + k, mask=mask, other=0.0).to(tl.float32)
    res = tl.load(res_ptr + r * stride_rm + k, mask=mask, other=0.0).to(tl.float32)
    s = (x + res).to(x_ptr.dtype.element_ty).to(tl.float32)
    return tl.rsqrt(tl.sum(s * s, axis=0) / K + eps)


@triton.jit
def _load_normed_row(x_ptr, res_ptr, nw_ptr, res_out_ptr, row, M, stride_xm, stride_rm, stride_rom, k, rstd,
                     store, EVEN_K: tl.constexpr, K: tl.constexpr):
    """rms_norm(x[row] + residual[row]) * weight at k as a [1, BLOCK_K] fp32 tile, rounded to x's dtype as the norm
    kernel's output is; where `store` (the first N tile's programs), the residual sum goes to residual_out."""
    dtype = x_ptr.dtype.element_ty
    r = tl.minimum(row, M - 1).to(tl.int64)
    if EVEN_K:
        x = tl.load(x_ptr + r * stride_xm + k)
        res = tl.load(res_ptr + r * stride_rm + k)
        nw = tl.load(nw_ptr + k)
        k_mask = k >= 0
    else:
        k_mask = k < K
        x = tl.load(x_ptr + r * stride_xm + k, mask=k_mask, other=0.0)
        res = tl.load(res_ptr + r * stride_rm + k, mask=k_mask, other=0.0)
        nw = tl.load(nw_ptr + k, mask=k_mask, other=0.0)
    s = (x.to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(res_out_ptr + r * stride_rom + k, s, mask=k_mask & store & (row < M))
    return (s.to(tl.float32) * rstd * nw.to(tl.float32)).to(dtype).to(tl.float32)


@triton.jit
def _fma_x_row(x_ptr, res_ptr, nw_ptr, res_out_ptr, row, M, stride_xm, stride_rm, stride_rom, k, rstd, store,
               EVEN_K: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr):
    """The FMA path's x tile of one row: x as it is, or (NORM) normalised from the residual sum."""
    if NORM:
        x = _load_normed_row(x_ptr, res_ptr, nw_ptr, res_out_ptr, row, M, stride_xm, stride_rm, stride_rom, k, rstd,
                             store, EVEN_K, K)
    else:
        x = _load_x_row(x_ptr, row, M, stride_xm, k, EVEN_K, K)
    return x


@triton.jit
def _fma_rows_to_tile(acc, acc0, acc1, acc2, acc3, BLOCK_M: tl.constexpr):
    """The FMA path's per-row [BLOCK_N, BLOCK_K] accumulators reduced over K into the rows of acc
    [BLOCK_M, BLOCK_N]."""
    row_ids = tl.arange(0, BLOCK_M)[:, None]
    acc = tl.where(row_ids == 0, tl.sum(acc0, axis=1)[None, :], acc)
    if BLOCK_M > 1:
        acc = tl.where(row_ids == 1, tl.sum(acc1, axis=1)[None, :], acc)
    if BLOCK_M > 2:
        acc = tl.where(row_ids == 2, tl.sum(acc2, axis=1)[None, :], acc)
    if BLOCK_M > 3:
        acc = tl.where(row_ids == 3, tl.sum(acc3, axis=1)[None, :], acc)
    return acc


@triton.jit
def _write_out(total, out_ptr, rm, m_mask, n_tile, N, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               GATED: tl.constexpr):
    """A finished fp32 tile into out: as it is, or (GATED) its (gate, up) column pairs as silu(gate) * up, with
    gate and up rounded to out's dtype first, as the unfused gate_up output and silu_and_mul kernel would be."""
    dtype = out_ptr.dtype.element_ty
    if GATED:
        gate, up = tl.split(tl.reshape(total, [BLOCK_M, BLOCK_N // 2, 2]))
        gate = gate.to(dtype).to(tl.float32)
        up = up.to(dtype).to(tl.float32)
        rj = n_tile * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rj[None, :]
        tl.store(ptrs, (gate * tl.sigmoid(gate) * up).to(dtype), mask=m_mask[:, None] & (rj < N)[None, :])
    else:
        rn = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
        tl.store(ptrs, total.to(dtype), mask=m_mask[:, None] & (rn < N)[None, :])


@triton.jit
def _store_tile(
    acc,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    rm,
    m_mask,
    n_mask,
    M,
    N,
    stride_om,
    m_tile,
    n_tile,
    m_tiles,
    k_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GATED: tl.constexpr,
):
    """Write a program's fp32 [BLOCK_M, BLOCK_N] result: straight to out, or with split-K as a partial in the
    workspace, the tile's last arrival summing the partials in split order into out and resetting the counter.
    The workspace holds the tile's columns as the program computed them (GATED: gate / up pairs, 2N wide)."""
    if SPLIT_K == 1:
        _write_out(acc, out_ptr, rm, m_mask, n_tile, N, stride_om, BLOCK_M, BLOCK_N, GATED)
    else:
        width = 2 * N if GATED else N
        plane = M.to(tl.int64) * width
        rv = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = m_mask[:, None] & n_mask[None, :]
        ws_tile = ws_ptr + rm.to(tl.int64)[:, None] * width + rv[None, :]
        tl.store(ws_tile + k_split * plane, acc, mask=mask)
        # Every thread's partial is written before the (single-thread) release of the arrival below.
        tl.debug_barrier()
        tile = n_tile * m_tiles + m_tile
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                # .cg: read at L2, where the other programs' partials are, never a stale L1 line.
                total += tl.load(ws_tile + s * plane, mask=mask, other=0.0, cache_modifier=".cg")
            _write_out(total, out_ptr, rm, m_mask, n_tile, N, stride_om, BLOCK_M, BLOCK_N, GATED)
            tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    stride_xm,
    stride_wn,
    stride_om,
    # NORM's (after the others: the plain kernel's parameters keep their places)
    res_ptr,
    res_out_ptr,
    nw_ptr,
    eps,
    stride_rm,
    stride_rom,
    K: tl.constexpr,
    K_POW2: tl.constexpr,
    K_SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_FP32: tl.constexpr,
    GATED: tl.constexpr,
    NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # x (and the residual) and the split-K counters belong to the kernels before
    # Neighbouring programs share an N tile (M tiles, then K splits): w is read from L2 by the later ones
    # and the last split of a tile arrives soon after the first.
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    m_tile = pid % m_tiles
    rest = pid // m_tiles
    k_split = rest % SPLIT_K
    n_tile = rest // SPLIT_K

    rm = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    local = tl.arange(0, BLOCK_N)
    if GATED:
        # Tile row 2i is gate row j, 2i + 1 up row j (= w row N + j), j = the tile's i-th output.
        rj = n_tile * (BLOCK_N // 2) + local // 2
        n_mask = rj < N
        rw = rj + (local % 2) * N
    else:
        rw = n_tile * BLOCK_N + local
        n_mask = rw < N
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + rw.to(tl.int64)[:, None] * stride_wn
    k_base = k_split * K_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)

    if USE_DOT:
        # A scf.for (not unrolled): the pipeliner stages the w tiles through shared memory (num_stages).
        for kk in range(0, K_SPLIT, BLOCK_K):
            k = k_base + kk + rk
            if EVEN_K:
                x = tl.load(x_rows + k[None, :], mask=m_mask[:, None], other=0.0)
                w = tl.load(w_rows + k[None, :], mask=n_mask[:, None], other=0.0)
            else:
                k_mask = k < K
                x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
                w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            if DOT_FP32:
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    else:
        # One unreduced [BLOCK_N, BLOCK_K] accumulator per x row (up to 4; rows past M are discarded) and a
        # single reduction after the loop: no cross-thread traffic or barrier between the K steps, so the
        # unrolled loads of every step can be in flight together. x rows are loaded as [1, BLOCK_K] tiles,
        # which get the w tile's layout (no conversion through shared memory).
        acc0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        row0 = m_tile * BLOCK_M
        # NORM: each row's 1 / RMS over all of K first (every program, every K split, computes its rows' own);
        # the w loads below do not depend on it.
        rstd0 = 1.0
        rstd1 = 1.0
        rstd2 = 1.0
        rstd3 = 1.0
        if NORM:
            rstd0 = _row_rstd(x_ptr, res_ptr, row0 + 0, M, stride_xm, stride_rm, eps, K, K_POW2)
            if BLOCK_M > 1:
                rstd1 = _row_rstd(x_ptr, res_ptr, row0 + 1, M, stride_xm, stride_rm, eps, K, K_POW2)
            if BLOCK_M > 2:
                rstd2 = _row_rstd(x_ptr, res_ptr, row0 + 2, M, stride_xm, stride_rm, eps, K, K_POW2)
            if BLOCK_M > 3:
                rstd3 = _row_rstd(x_ptr, res_ptr, row0 + 3, M, stride_xm, stride_rm, eps, K, K_POW2)
        store = n_tile == 0
        for kk in tl.static_range(0, K_SPLIT, BLOCK_K):
            k = (k_base + kk + rk)[None, :]
            if EVEN_K:
                w = tl.load(w_rows + k, mask=n_mask[:, None], other=0.0).to(tl.float32)
            else:
                w = tl.load(w_rows + k, mask=n_mask[:, None] & (k < K), other=0.0).to(tl.float32)
            acc0 += w * _fma_x_row(x_ptr, res_ptr, nw_ptr, res_out_ptr, row0 + 0, M, stride_xm, stride_rm,
                                   stride_rom, k, rstd0, store, EVEN_K, K, NORM)
            if BLOCK_M > 1:
                acc1 += w * _fma_x_row(x_ptr, res_ptr, nw_ptr, res_out_ptr, row0 + 1, M, stride_xm, stride_rm,
                                       stride_rom, k, rstd1, store, EVEN_K, K, NORM)
            if BLOCK_M > 2:
                acc2 += w * _fma_x_row(x_ptr, res_ptr, nw_ptr, res_out_ptr, row0 + 2, M, stride_xm, stride_rm,
                                       stride_rom, k, rstd2, store, EVEN_K, K, NORM)
            if BLOCK_M > 3:
                acc3 += w * _fma_x_row(x_ptr, res_ptr, nw_ptr, res_out_ptr, row0 + 3, M, stride_xm, stride_rm,
                                       stride_rom, k, rstd3, store, EVEN_K, K, NORM)
        acc = _fma_rows_to_tile(acc, acc0, acc1, acc2, acc3, BLOCK_M)

    _store_tile(acc, out_ptr, ws_ptr, cnt_ptr, rm, m_mask, n_mask, M, N, stride_om,
                m_tile, n_tile, m_tiles, k_split, BLOCK_M, BLOCK_N, SPLIT_K, GATED)


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters, at least n. Buffers are never freed: a captured graph keeps their
    address. A new one cannot be zeroed during capture (the memset would only run at replay)."""
    bufs = _counters.setdefault(device, [])
    if bufs and bufs[-1].numel() >= n:
        return bufs[-1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"gemv split-K needs {n} arrival counters on {device}, not allocated before CUDA graph "
                           "capture: run this shape once eagerly (warmup) before capturing")
    bufs.append(torch.zeros(max(n, _COUNTER_SLOTS), dtype=torch.int32, device=device))
    return bufs[-1]


@dataclasses.dataclass(frozen=True)
class NormPrologue:
    """gemv's `norm`: x is multiplied as rms_norm(x + residual) * weight, and x + residual goes to residual_out.
    residual, residual_out: [M, K] in x's dtype, unit last stride; weight [K]."""

    residual: torch.Tensor
    weight: torch.Tensor
    eps: float
    residual_out: torch.Tensor


def _check_norm(norm: NormPrologue, rows: torch.Tensor, x_dim: int) -> None:
    M, K = rows.shape
    if x_dim != 2:
        raise ValueError(f"gemv norm: expected 2-D x, got {x_dim}-D")
    for name in ("residual", "residual_out"):
        t = getattr(norm, name)
        if tuple(t.shape) != (M, K) or t.stride(1) != 1 or t.dtype != rows.dtype or t.device != rows.device:
            raise ValueError(f"gemv norm {name}: expected [{M}, {K}] {rows.dtype} on {rows.device} with unit last "
                             f"stride, got {tuple(t.shape)} {t.dtype} strides {t.stride()} on {t.device}")
    if tuple(norm.weight.shape) != (K,) or norm.weight.stride(0) != 1 or norm.weight.device != rows.device:
        raise ValueError(f"gemv norm weight: expected [{K}] contiguous on {rows.device}, got "
                         f"{tuple(norm.weight.shape)} on {norm.weight.device}")


def gemv(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, config: GemvConfig | None = None,
    pdl: bool | None = None, gated: bool = False, norm: NormPrologue | None = None,
) -> torch.Tensor:
    """x [..., K] @ w[N, K]^T -> [..., N] in x's dtype (written into `out` when given: [..., N], unit last
    stride, rows at any stride when x is 2-D). pdl: `launch.pdl`'s wanted. gated: w is [gate; up], [2I, K], and
    the result silu(x @ gate^T) * (x @ up^T), [..., I] (N = I below); the config is w's shape's, its tile at
    least one (gate, up) pair wide. norm: the residual add and RMSNorm before the product (2-D x, the FMA path;
    ValueError for a config on the tensor-core path)."""
    if w.dim() != 2 or w.stride(1) != 1:
        raise ValueError(f"gemv w: expected [N, K] with unit last stride, got shape {tuple(w.shape)} "
                         f"strides {w.stride()}")
    rows_w, K = w.shape
    if gated and rows_w % 2:
        raise ValueError(f"gemv gated w: expected [2 * I, K] (gate rows then up rows), got {tuple(w.shape)}")
    N = rows_w // 2 if gated else rows_w
    if x.dim() == 0 or x.shape[-1] != K:
        raise ValueError(f"gemv x: expected [..., {K}] (w is [{rows_w}, {K}]), got shape {tuple(x.shape)}")
    if x.dtype != w.dtype or x.device != w.device:
        raise ValueError(f"gemv: x and w must share dtype and device, got {x.dtype} on {x.device} and "
                         f"{w.dtype} on {w.device}")
    rows = x.reshape(x.shape[:-1].numel(), K)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    M = rows.shape[0]
    out_shape = (*x.shape[:-1], N)
    if out is None:
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != out_shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"gemv out: expected shape {out_shape} {x.dtype} on {x.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    try:
        out_rows = out if out.dim() == 2 else out.view(rows.shape[0], N)
    except RuntimeError:
        out_rows = out.new_empty(0)  # not viewable as rows: rejected below
    if out_rows.dim() != 2 or out_rows.stride(1) != 1:
        raise ValueError(f"gemv out: expected rows of {N} with unit last stride, got shape {tuple(out.shape)} "
                         f"strides {out.stride()}")
    if norm is not None:
        _check_norm(norm, rows, x.dim())
    if M == 0 or N == 0 or K == 0:
        if norm is not None:
            torch.add(x, norm.residual, out=norm.residual_out)
        return out if M == 0 or N == 0 else out.zero_()
    cfg = config if config is not None else pick_config(M, rows_w, K)
    if gated and cfg.block_n == 1:
        cfg = dataclasses.replace(cfg, block_n=2)  # one (gate, up) pair: the same w rows a thread, twice
    check_config(cfg)
    if norm is not None and cfg.use_dot:
        raise ValueError(f"gemv norm: the norm prologue runs on the FMA path only, got {cfg}")

    m_tiles, n_tiles = triton.cdiv(M, cfg.block_m), triton.cdiv(rows_w, cfg.block_n)
    k_split = triton.cdiv(K, cfg.split_k * cfg.block_k) * cfg.block_k
    if cfg.split_k > 1:
        ws = torch.empty((cfg.split_k, M, rows_w), dtype=torch.float32, device=x.device)
        cnt = _split_counters(x.device, m_tiles * n_tiles)
    else:
        ws, cnt = out_rows, out_rows  # dead arguments: SPLIT_K == 1 is a constexpr
    # The interpreter's dot multiplies bf16 bit patterns (stored as uint16): upcast there, never on a GPU.
    interpret_bf16 = x.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    # A one-row stride is never read; a fixed value keeps one compiled specialization for every M.
    x_stride = rows.stride(0) if M > 1 else K
    o_stride = out_rows.stride(0) if M > 1 else N
    on = launch_pdl(x, M, pdl)
    if norm is not None:
        res, res_out, nw, eps = norm.residual, norm.residual_out, norm.weight, norm.eps
        r_stride = res.stride(0) if M > 1 else K
        ro_stride = res_out.stride(0) if M > 1 else K
    else:  # dead arguments: NORM is a constexpr
        res, res_out, nw, eps, r_stride, ro_stride = rows, rows, rows, 0.0, K, K
    _gemv_kernel[(m_tiles * n_tiles * cfg.split_k,)](
        rows, w, out_rows, ws, cnt, M, N, x_stride, w.stride(0), o_stride, res, res_out, nw, eps, r_stride,
        ro_stride, K=K, K_POW2=triton.next_power_of_2(K), K_SPLIT=k_split, EVEN_K=k_split * cfg.split_k == K,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        USE_DOT=cfg.use_dot, PRECISION="ieee" if interpret_bf16 or x.dtype == torch.float32 else "tf32",
        DOT_FP32=interpret_bf16, GATED=gated, NORM=norm is not None, PDL=on,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(on),
    )
    return out


def warmup_gemv(
    shapes: list[tuple[int, int]], batch_sizes: list[int], dtype: torch.dtype, device: torch.device | str
) -> None:
    """Compile the picked config of every (N, K) weight shape at every batch size, and allocate the split-K
    counters, before CUDA graph capture."""
    for n, k in shapes:
        w = torch.zeros(n, k, dtype=dtype, device=device)
        for m in sorted(set(batch_sizes)):
            gemv(torch.zeros(m, k, dtype=dtype, device=device), w)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
