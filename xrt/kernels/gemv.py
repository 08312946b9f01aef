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
    GATED: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # x and the split-K counters belong to the kernels before
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
        for kk in tl.static_range(0, K_SPLIT, BLOCK_K):
            k = (k_base + kk + rk)[None, :]
            if EVEN_K:
                w = tl.load(w_rows + k, mask=n_mask[:, None], other=0.0).to(tl.float32)
            else:
                w = tl.load(w_rows + k, mask=n_mask[:, None] & (k < K), other=0.0).to(tl.float32)
            acc0 += w * _load_x_row(x_ptr, row0 + 0, M, stride_xm, k, EVEN_K, K)
            if BLOCK_M > 1:
                acc1 += w * _load_x_row(x_ptr, row0 + 1, M, stride_xm, k, EVEN_K, K)
            if BLOCK_M > 2:
                acc2 += w * _load_x_row(x_ptr, row0 + 2, M, stride_xm, k, EVEN_K, K)
            if BLOCK_M > 3:
                acc3 += w * _load_x_row(x_ptr, row0 + 3, M, stride_xm, k, EVEN_K, K)
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


def gemv(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, config: GemvConfig | None = None,
    pdl: bool | None = None, gated: bool = False,
) -> torch.Tensor:
    """x [..., K] @ w[N, K]^T -> [..., N] in x's dtype (written into `out` when given: [..., N], unit last
    stride, rows at any stride when x is 2-D). pdl: `launch.pdl`'s wanted. gated: w is [gate; up], [2I, K], and
    the result silu(x @ gate^T) * (x @ up^T), [..., I] (N = I below); the config is w's shape's, its tile at
    least one (gate, up) pair wide."""
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
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    cfg = config if config is not None else pick_config(M, rows_w, K)
    if gated and cfg.block_n == 1:
        cfg = dataclasses.replace(cfg, block_n=2)  # one (gate, up) pair: the same w rows a thread, twice
    check_config(cfg)

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
    _gemv_kernel[(m_tiles * n_tiles * cfg.split_k,)](
        rows, w, out_rows, ws, cnt, M, N, x_stride, w.stride(0), o_stride,
        K=K, K_SPLIT=k_split, EVEN_K=k_split * cfg.split_k == K,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        USE_DOT=cfg.use_dot, PRECISION="ieee" if interpret_bf16 or x.dtype == torch.float32 else "tf32",
        DOT_FP32=interpret_bf16, GATED=gated, PDL=on,
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
