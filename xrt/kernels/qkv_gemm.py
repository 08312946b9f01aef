"""The prefill's qkv projection with the q/k norm, RoPE and KV write in its epilogue: what `xrt::linear` then
`xrt::qk_norm_rope_store_kv` do, in one launch that writes qkv once and never reads it back.

Grid: (token tiles x heads), grouped along the tokens so the programs running together share weight tiles in L2.
A program owns BLOCK_M tokens of one head (a q, k or v head: the tile is one head wide), so each row of its
accumulator is one whole head of one token and the per-head RMSNorm needs nothing from other programs. NeoX RoPE
pairs column i with i + D / 2: the accumulator is split into its halves after the K loop (or, `one_dot=False`,
computed as two dots of D / 2 columns, which are the halves already). `tma=True` loads the operand tiles through
tensor descriptors (the copy engine) instead of pointer loads.
The accumulator is rounded to the activation dtype before the norm, as the unfused GEMM's output would be; from
there the numerics are `xrt.kernels.qk_norm_rope`'s (fp32 norm, weight and rotation, one rounding). k and v heads
also go to the paged cache at `slot_mapping` (rows with slot < 0 are not written). Given the input norm's weight,
the layer's RMSNorm before the GEMM is its prologue (`executor.fuse_prefill_norms`, `gemm_tiles`).

Only for prefill-sized launches: a skinny decode batch runs `xrt::linear` (its kernel where it wins) and the
attention kernel that fuses the norm and RoPE itself. The launch is not captured with PDL (prefill rows exceed
`executor.pdl_max_rows`)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from xrt.kernels.gemm_tiles import check_norm_weight, dual_dot, grouped_tile, rms_scale, single_dot, tma_dot
from xrt.kernels.store_kv import check_kv_cache

# Tokens per program and K step: 128 x 128 tiles on tensor cores, 8 warps (one warp group per 64 rows).
BLOCK_M = 128
BLOCK_K = 64
NUM_WARPS = 8
NUM_STAGES = 3
# Token tiles a group of programs walks before moving to the next heads (weight tiles stay in L2 meanwhile).
GROUP_M = 8
# One dot of the whole head a K step, split into halves after, or a dot per half (kept for the kernel bench).
ONE_DOT = True
# The operand tiles by tensor descriptors (Hopper's TMA) instead of pointer loads (off until the bench says).
TMA = False


@triton.jit
def _norm_rope_halves(y1, y2, w_ptr, cos, sin, eps, HALF: tl.constexpr):
    """Rows of one head as two [BM, HALF] halves (rounded values) -> RMSNorm * w, NeoX-rotated, fp32."""
    d = tl.arange(0, HALF)[None, :]
    w1 = tl.load(w_ptr + d).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + d).to(tl.float32)
    x1 = y1.to(tl.float32)
    x2 = y2.to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
    n1 = x1 * rstd * w1
    n2 = x2 * rstd * w2
    return n1 * cos - n2 * sin, n2 * cos + n1 * sin


# The token count is the one argument that changes between calls: not specialised on, so one compile serves all.
@triton.jit(do_not_specialize=["M"])
def _qkv_gemm_kernel(
    x_ptr, w_ptr, out_ptr, q_w_ptr, k_w_ptr, cos_sin_ptr, pos_ptr, cache_ptr, slot_ptr, norm_ptr,
    M, K, stride_xm, stride_om, stride_cs,
    c_page_stride, c_kv_stride, c_slot_stride, c_head_stride, page_size, eps,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, ONE_DOT: tl.constexpr, TMA: tl.constexpr,
    DOT_FP32: tl.constexpr, NORM: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    pm, head = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), NUM_HEADS + 2 * NUM_KV_HEADS, GROUP_M)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < M
    rk = tl.arange(0, BLOCK_K)
    rh = tl.arange(0, HALF)
    dtype = out_ptr.dtype.element_ty
    if TMA:
        # x_ptr and w_ptr are tensor descriptors ([BLOCK_M, BLOCK_K] and [HEAD_DIM, BLOCK_K] blocks): the tiles come
        # in by the copy engine, rows past M as zeros.
        acc, ss = tma_dot(x_ptr, w_ptr, pm * BLOCK_M, head * HEAD_DIM, K, norm_ptr, BLOCK_M, HEAD_DIM, BLOCK_K,
                          DOT_FP32, NORM)
        if NORM:
            acc = rms_scale(acc, ss, K, eps)
        y1, y2 = tl.split(tl.permute(tl.reshape(acc.to(dtype), [BLOCK_M, 2, HALF]), (0, 2, 1)))
    elif ONE_DOT:
        # One [BLOCK_M, HEAD_DIM] dot a K step (the wider tensor-core instruction), split into halves after.
        # x [M, K]; weight [N, K] contiguous, the head's rows head * HEAD_DIM ...
        x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
        w_ptrs = w_ptr + (head * HEAD_DIM + tl.arange(0, HEAD_DIM))[:, None].to(tl.int64) * K + rk[None, :]
        # K is a multiple of BLOCK_K (`supports`); the head's rows are all in the weight (no mask).
        acc, ss = single_dot(x_ptrs, w_ptrs, m_ok, m_ok, K, norm_ptr, BLOCK_M, HEAD_DIM, BLOCK_K, DOT_FP32, NORM,
                             False)
        if NORM:
            acc = rms_scale(acc, ss, K, eps)
        y1, y2 = tl.split(tl.permute(tl.reshape(acc.to(dtype), [BLOCK_M, 2, HALF]), (0, 2, 1)))
    else:
        # The head's halves as two dots of HALF columns: the accumulators are already the halves RoPE pairs.
        x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
        w1_ptrs = w_ptr + (head * HEAD_DIM + rh)[:, None].to(tl.int64) * K + rk[None, :]
        acc1, acc2, ss = dual_dot(x_ptrs, w1_ptrs, w1_ptrs + HALF * K, m_ok, rh >= 0, K, norm_ptr, BLOCK_M, HALF,
                                  BLOCK_K, DOT_FP32, NORM)
        if NORM:
            acc1 = rms_scale(acc1, ss, K, eps)
            acc2 = rms_scale(acc2, ss, K, eps)
        y1 = acc1.to(dtype)
        y2 = acc2.to(dtype)
    out_rows = out_ptr + rm[:, None].to(tl.int64) * stride_om + head * HEAD_DIM + rh[None, :]
    if head < NUM_HEADS + NUM_KV_HEADS:
        pos = tl.load(pos_ptr + rm, mask=m_ok, other=0).to(tl.int64)
        cs = cos_sin_ptr + pos[:, None] * stride_cs + rh[None, :]
        cos = tl.load(cs, mask=m_ok[:, None], other=0.0).to(tl.float32)
        sin = tl.load(cs + HALF, mask=m_ok[:, None], other=0.0).to(tl.float32)
        if head < NUM_HEADS:
            o1, o2 = _norm_rope_halves(y1, y2, q_w_ptr, cos, sin, eps, HALF)
        else:
            o1, o2 = _norm_rope_halves(y1, y2, k_w_ptr, cos, sin, eps, HALF)
        y1 = o1.to(dtype)
        y2 = o2.to(dtype)
    tl.store(out_rows, y1, mask=m_ok[:, None])
    tl.store(out_rows + HALF, y2, mask=m_ok[:, None])
    if head >= NUM_HEADS:
        slot = tl.load(slot_ptr + rm, mask=m_ok, other=-1).to(tl.int64)
        keep = (slot >= 0)[:, None]
        safe = tl.where(slot >= 0, slot, 0)
        kv = (head >= NUM_HEADS + NUM_KV_HEADS).to(tl.int64)  # 0: a k head, 1: its v head
        kvh = (head - NUM_HEADS - kv * NUM_KV_HEADS).to(tl.int64)
        dst = (cache_ptr + (safe // page_size)[:, None] * c_page_stride + (safe % page_size)[:, None] * c_slot_stride
               + kv * c_kv_stride + kvh * c_head_stride + rh[None, :])
        cache_ty = cache_ptr.dtype.element_ty
        tl.store(dst, y1.to(cache_ty), mask=keep)
        tl.store(dst + HALF, y2.to(cache_ty), mask=keep)


def supports(x: torch.Tensor, head_dim: int, block_k: int = BLOCK_K) -> bool:
    """Whether the kernel takes this input: 16-bit activations (tensor cores), a head of a power of two >= 32
    columns (each half one dot of >= 16), a hidden size in whole K steps."""
    return (x.dtype in (torch.bfloat16, torch.float16) and head_dim >= 32 and not head_dim & (head_dim - 1)
            and x.dim() == 2 and x.shape[1] % block_k == 0)


def linear_qk_norm_rope_store_kv(
    x: torch.Tensor, weight: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int, eps: float, norm_weight: torch.Tensor | None = None, *,
    block_m: int = BLOCK_M, block_k: int = BLOCK_K, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES,
    one_dot: bool = ONE_DOT, tma: bool = TMA,
) -> torch.Tensor:
    """x [T, K] @ weight [(H + 2 KV) * D, K]^T, its q and k heads normalised and rotated, its k and v heads
    written to kv_cache at slot_mapping: returns qkv [T, (H + 2 KV) * D] as xrt::qk_norm_rope_store_kv leaves it.
    With norm_weight [K], x's rows RMS-normalised first (the same eps; the RMSNorm prologue). The tile arguments
    are for the kernel bench and the CPU tests; the defaults are what the op runs."""
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"linear_qk_norm_rope_store_kv x: expected [tokens, hidden] with unit last stride, got "
                         f"shape {tuple(x.shape)} strides {x.stride()}")
    t, k = x.shape
    if tuple(weight.shape) != (width, k) or not weight.is_contiguous() or weight.dtype != x.dtype:
        raise ValueError(f"linear_qk_norm_rope_store_kv weight: expected a contiguous [{width}, {k}] {x.dtype}, got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    if not supports(x, head_dim, block_k):
        raise ValueError(f"linear_qk_norm_rope_store_kv: expected 16-bit x with a hidden size that is a multiple of "
                         f"{block_k} and head_dim a power of two >= 32, got {x.dtype}, hidden {k}, head_dim "
                         f"{head_dim}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if tuple(w.shape) != (head_dim,) or w.stride(0) != 1:
            raise ValueError(f"linear_qk_norm_rope_store_kv {name}: expected a contiguous [{head_dim}], got "
                             f"{tuple(w.shape)}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim or cos_sin_cache.stride(1) != 1:
        raise ValueError(f"linear_qk_norm_rope_store_kv cos_sin_cache: expected [max_pos, {head_dim}] with unit "
                         f"last stride, got {tuple(cos_sin_cache.shape)}")
    for name, v in (("positions", positions), ("slot_mapping", slot_mapping)):
        if tuple(v.shape) != (t,) or (t > 1 and v.stride(0) != 1):
            raise ValueError(f"linear_qk_norm_rope_store_kv {name}: expected a contiguous [{t}], got "
                             f"{tuple(v.shape)}")
    check_kv_cache(kv_cache, num_kv_heads, head_dim)
    check_norm_weight("linear_qk_norm_rope_store_kv", norm_weight, k)
    out = x.new_empty(t, width)
    if t == 0:
        return out
    # The interpreter's dot multiplies 16-bit floats as their bit patterns: upcast there, never on a GPU.
    dot_fp32 = x.dtype != torch.float32 and os.environ.get("TRITON_INTERPRET") == "1"
    grid = (triton.cdiv(t, block_m) * (num_heads + 2 * num_kv_heads),)
    x_arg, w_arg = x, weight
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_arg = TensorDescriptor.from_tensor(x, [block_m, block_k])
        w_arg = TensorDescriptor.from_tensor(weight, [head_dim, block_k])
    _qkv_gemm_kernel[grid](
        x_arg, w_arg, out, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping,
        x if norm_weight is None else norm_weight, t, k, x.stride(0), out.stride(0), cos_sin_cache.stride(0),
        *kv_cache.stride()[:4], kv_cache.shape[2], float(eps),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_K=block_k, GROUP_M=GROUP_M, ONE_DOT=one_dot, TMA=tma, DOT_FP32=dot_fp32,
        NORM=norm_weight is not None, num_warps=num_warps, num_stages=num_stages,
    )
    return out
