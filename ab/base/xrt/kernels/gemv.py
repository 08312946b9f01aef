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
the result is deterministic. Configs are fixed per shape (`pick_config`), never autotuned: every launch is
capture-safe once each (M bucket, shape) has run eagerly once to compile it."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import pdl, pdl_enter, pdl_launch

# Programs wanted per launch: about four per SM on a 132-SM H100/H200, enough memory requests in flight.
_TARGET_PROGRAMS = 512
# w elements one FMA program loads per K step: 16 KB in bf16, 64 per thread at 4 warps, no spills.
_FMA_TILE_ELEMS = 8192
# Arrival counters per device for split-K; they reset themselves, so they are zeroed only when allocated.
_COUNTER_SLOTS = 1 << 16
_counters: dict[torch.device, list[torch.Tensor]] = {}


@dataclass(frozen=True)
class GemvConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    split_k: int = 1
    use_dot: bool = False
    num_stages: int = 1

    def __str__(self) -> str:
        kind = "dot" if self.use_dot else "fma"
        return (f"{kind} m{self.block_m} n{self.block_n} k{self.block_k} w{self.num_warps} "
                f"s{self.split_k}" + (f" st{self.num_stages}" if self.use_dot else ""))


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def check_config(cfg: GemvConfig) -> None:
    for name in ("block_m", "block_n", "block_k", "num_warps"):
        if not _pow2(getattr(cfg, name)):
            raise ValueError(f"gemv config {name}: expected a power of two, got {getattr(cfg, name)}")
    if cfg.split_k < 1 or cfg.num_stages < 1:
        raise ValueError(f"gemv config split_k and num_stages: expected >= 1, got {cfg.split_k}, {cfg.num_stages}")
    if not cfg.use_dot and cfg.block_m > 4:
        raise ValueError(f"gemv config: the FMA path holds at most 4 rows (block_m <= 4), got {cfg}")
    if cfg.use_dot and min(cfg.block_m, cfg.block_n, cfg.block_k) < 16:
        raise ValueError(f"gemv config: the dot path needs block_m, block_n, block_k >= 16, got {cfg}")


def _split_k(K: int, block_k: int, tiles: int) -> int:
    """K splits bringing the programs up to about half the target, dividing the K steps evenly (no empty split)."""
    if tiles >= _TARGET_PROGRAMS // 2:
        return 1
    steps = triton.cdiv(K, block_k)
    want = min(steps, triton.cdiv(_TARGET_PROGRAMS // 2, tiles))
    return max(d for d in range(1, want + 1) if steps % d == 0)


# Winners of scripts/bench_gemv.py on the H200 (bench/results/h200-microbench/gemv.md), keyed (N, K, M):
# the Qwen3-0.6B decode shapes at M = 1 and 8.
_MEASURED = {
    (4096, 1024, 1): GemvConfig(1, 2, 512, 2),
    (1024, 2048, 1): GemvConfig(1, 2, 1024, 4),
    (6144, 1024, 1): GemvConfig(1, 2, 512, 2),
    (1024, 3072, 1): GemvConfig(1, 1, 1024, 4),
    (151936, 1024, 1): GemvConfig(1, 2, 512, 2),
    (1024, 2048, 8): GemvConfig(4, 4, 512, 2),
    (1024, 3072, 8): GemvConfig(4, 4, 512, 2),
    (151936, 1024, 8): GemvConfig(16, 32, 256, 4, use_dot=True, num_stages=3),
}


def prefer_gemv(M: int, N: int, K: int) -> bool:
    """Whether this kernel beat cuBLAS for the shape on the H200: every measured shape at M = 1 (1.1-3.9x);
    at M = 8 only narrow outputs (o_proj, down: 1.25-1.4x) and lm_head, while cuBLAS won qkv and gate_up."""
    if M == 1:
        return True
    return M <= 8 and (N <= 2048 or N >= 65536)


def pick_config(M: int, N: int, K: int) -> GemvConfig:
    """Fixed config for a shape (dtype-agnostic, tuned for 16-bit): the H200 measurement where there is one
    (M rounded up to the measured 1 or 8), else a heuristic."""
    return _MEASURED.get((N, K, 1 if M == 1 else 8 if M <= 8 else 0)) or heuristic_config(M, N, K)


@functools.lru_cache(maxsize=4096)
def heuristic_config(M: int, N: int, K: int) -> GemvConfig:
    """The config rules used before measurement (and for unmeasured shapes)."""
    if M <= 4:
        block_k = min(triton.next_power_of_2(K), 1024)
        # x rows get the w tile's register layout only when one K step spans all warps at 8 elements a thread
        # (256 * num_warps); otherwise the compiler shuffles w through shared memory.
        num_warps = max(1, min(4, block_k // 256))
        block_m = triton.next_power_of_2(M)
        block_n = max(1, _FMA_TILE_ELEMS // (block_k * block_m))
        # Narrow tiles before splitting K: more programs and no fix-up.
        while block_n > 1 and triton.cdiv(N, block_n) < _TARGET_PROGRAMS:
            block_n //= 2
        return GemvConfig(block_m, block_n, block_k, num_warps, _split_k(K, block_k, triton.cdiv(N, block_n)))
    if M <= 16:
        block_k = max(16, min(triton.next_power_of_2(K), 256))
        # Narrower tiles for small N, so that K is split in at most a few parts.
        block_n = 32 if triton.cdiv(N, 32) >= _TARGET_PROGRAMS // 4 else 16
        split = _split_k(K, block_k, triton.cdiv(N, block_n))
        return GemvConfig(16, block_n, block_k, num_warps=4, split_k=split, use_dot=True, num_stages=3)
    # Larger M is not this kernel's target (cuBLAS wins there): a plain tensor-core tiling, kept correct.
    block_k = max(16, min(triton.next_power_of_2(K), 64))
    return GemvConfig(min(64, triton.next_power_of_2(M)), 64, block_k, num_warps=4, use_dot=True, num_stages=3)


def _fma_fits(cfg: GemvConfig, K: int) -> bool:
    """Register budget of the FMA path (checked with ptxas for sm_90): fp32 accumulators per thread, and w
    elements per thread over the whole unrolled K range (the loads of every step are hoisted together)."""
    threads = 32 * cfg.num_warps
    k_range = triton.cdiv(K, cfg.split_k * cfg.block_k) * cfg.block_k
    return (cfg.block_m * cfg.block_n * cfg.block_k // threads <= 128
            and cfg.block_n * k_range // threads <= 192)


def candidate_configs(M: int, N: int, K: int) -> list[GemvConfig]:
    """A few plausible configs for a shape, the heuristic's first, for scripts/bench_gemv.py to time."""
    out = [pick_config(M, N, K)]

    def add(cfg: GemvConfig) -> None:
        if cfg not in out:
            out.append(cfg)

    kp = triton.next_power_of_2(K)
    if M <= 8:
        block_m = min(4, triton.next_power_of_2(M))
        for warps in (2, 4, 8):
            block_k = min(256 * warps, kp)
            if block_k < 256 * warps and warps > max(1, kp // 256):
                continue
            for block_n in (1, 2, 4, 8, 16):
                cfg = GemvConfig(block_m, block_n, block_k, warps)
                if _fma_fits(cfg, K) and triton.cdiv(N, block_n) >= 132:
                    add(cfg)
        if triton.cdiv(N, 8) < _TARGET_PROGRAMS:
            for warps in (2, 4):
                block_k = min(256 * warps, kp)
                for split in (2, 3, 4):
                    cfg = GemvConfig(block_m, 8 // block_m if block_m > 1 else 8, block_k, warps, split_k=split)
                    if triton.cdiv(K, block_k) % split == 0 and _fma_fits(cfg, K):
                        add(cfg)
    if M >= 2:
        block_m = 16 if M <= 16 else min(64, triton.next_power_of_2(M))
        for block_n, block_k, stages in ((16, 256, 3), (32, 256, 3), (32, 128, 4), (64, 128, 3), (16, 512, 2)):
            block_k = max(16, min(block_k, kp))
            for split in sorted({1, _split_k(K, block_k, triton.cdiv(N, block_n))}):
                add(GemvConfig(block_m, block_n, block_k, 4, split_k=split, use_dot=True, num_stages=stages))
    return out


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
def _store_tile(
    acc,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    rm,
    rn,
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
):
    """Write a program's fp32 [BLOCK_M, BLOCK_N] result: straight to out, or with split-K as a partial in the
    workspace, the tile's last arrival summing the partials in split order into out and resetting the counter."""
    out_ptrs = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        plane = M.to(tl.int64) * N
        ws_tile = ws_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
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
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
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
    rn = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_mask = rm < M
    n_mask = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
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

    _store_tile(acc, out_ptr, ws_ptr, cnt_ptr, rm, rn, m_mask, n_mask, M, N, stride_om,
                m_tile, n_tile, m_tiles, k_split, BLOCK_M, BLOCK_N, SPLIT_K)


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
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, config: GemvConfig | None = None
) -> torch.Tensor:
    """x [..., K] @ w[N, K]^T -> [..., N] in x's dtype (written into `out` when given: [..., N], unit last
    stride, rows at any stride when x is 2-D)."""
    if w.dim() != 2 or w.stride(1) != 1:
        raise ValueError(f"gemv w: expected [N, K] with unit last stride, got shape {tuple(w.shape)} "
                         f"strides {w.stride()}")
    N, K = w.shape
    if x.dim() == 0 or x.shape[-1] != K:
        raise ValueError(f"gemv x: expected [..., {K}] (w is [{N}, {K}]), got shape {tuple(x.shape)}")
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
    cfg = config if config is not None else pick_config(M, N, K)
    check_config(cfg)

    m_tiles, n_tiles = triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n)
    k_split = triton.cdiv(K, cfg.split_k * cfg.block_k) * cfg.block_k
    if cfg.split_k > 1:
        ws = torch.empty((cfg.split_k, M, N), dtype=torch.float32, device=x.device)
        cnt = _split_counters(x.device, m_tiles * n_tiles)
    else:
        ws, cnt = out_rows, out_rows  # dead arguments: SPLIT_K == 1 is a constexpr
    # The interpreter's dot multiplies bf16 bit patterns (stored as uint16): upcast there, never on a GPU.
    interpret_bf16 = x.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    # A one-row stride is never read; a fixed value keeps one compiled specialization for every M.
    x_stride = rows.stride(0) if M > 1 else K
    o_stride = out_rows.stride(0) if M > 1 else N
    on = pdl(x, M)
    _gemv_kernel[(m_tiles * n_tiles * cfg.split_k,)](
        rows, w, out_rows, ws, cnt, M, N, x_stride, w.stride(0), o_stride,
        K=K, K_SPLIT=k_split, EVEN_K=k_split * cfg.split_k == K,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        USE_DOT=cfg.use_dot, PRECISION="ieee" if interpret_bf16 or x.dtype == torch.float32 else "tf32",
        DOT_FP32=interpret_bf16, PDL=on,
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
