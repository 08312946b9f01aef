"""Per-head RMSNorm of the q and k heads then NeoX RoPE, in place on the packed qkv [T, (H + 2KV) * D].
One program per (token, block of HEAD_BLOCK consecutive q/k heads): a [HEAD_BLOCK, D/2] tile per half, so
1024 tokens of a 16 + 8 head model are 3072 programs of 2 warps, one wave on an H100/H200 (one program
per (token, head) was 24576 one-warp programs, latency-bound at 17 us). The block size is fixed (never
chosen from the token count) so one compiled kernel serves every batch. The fused variant also writes
each rotated k head and its v head into the paged cache, saving the separate store_kv launch.

Numerics follow xrt.ops.reference: norm, weight and rotation (fp32 cos/sin cache) all in fp32, rounded
once to the qkv dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import block_size, num_warps_for, pdl_enter, pdl_launch
from xrt.kernels.launch import pdl as launch_pdl
from xrt.kernels.store_kv import check_kv_cache

# Heads per program: 3 programs per token for Qwen3-0.6B's 16 q + 8 k heads, so a one-token decode
# still spreads over a few SMs.
HEAD_BLOCK = 8


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,
    q_w_ptr,
    k_w_ptr,
    cos_sin_ptr,
    pos_ptr,
    cache_ptr,
    slot_ptr,
    qkv_row_stride,
    cos_sin_row_stride,
    c_page_stride,
    c_kv_stride,
    c_slot_stride,
    c_head_stride,
    page_size,
    num_heads,
    num_kv_heads,
    head_dim,
    eps,
    HEAD_BLOCK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    STORE_KV: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEAD_BLOCK + tl.arange(0, HEAD_BLOCK)  # q heads, then k heads
    half = head_dim // 2
    d = tl.arange(0, BLOCK_HALF)
    dmask = d[None, :] < half
    live = (heads < num_heads + num_kv_heads)[:, None] & dmask
    is_q = heads < num_heads
    dtype = qkv_ptr.dtype.element_ty

    row = qkv_ptr + tok * qkv_row_stride
    # k heads follow the q heads directly, so head * head_dim addresses both.
    ptrs = row + heads[:, None] * head_dim + d[None, :]
    x1 = tl.load(ptrs, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + half, mask=live, other=0.0).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / head_dim + eps)[:, None]

    dm = d < half
    w1 = tl.where(is_q[:, None], tl.load(q_w_ptr + d, mask=dm, other=0.0).to(tl.float32)[None, :],
                  tl.load(k_w_ptr + d, mask=dm, other=0.0).to(tl.float32)[None, :])
    w2 = tl.where(is_q[:, None], tl.load(q_w_ptr + half + d, mask=dm, other=0.0).to(tl.float32)[None, :],
                  tl.load(k_w_ptr + half + d, mask=dm, other=0.0).to(tl.float32)[None, :])
    n1 = x1 * rstd * w1
    n2 = x2 * rstd * w2

    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cs_row = cos_sin_ptr + pos * cos_sin_row_stride
    cos = tl.load(cs_row + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cs_row + half + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    o1 = (n1 * cos - n2 * sin).to(dtype)
    o2 = (n2 * cos + n1 * sin).to(dtype)
    tl.store(ptrs, o1, mask=live)
    tl.store(ptrs + half, o2, mask=live)

    if STORE_KV:
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        # Only k heads write, and nothing for padded rows (slot -1). The slot condition is folded into a
        # bound: the interpreter rejects a tensor mask combined with a scalar condition.
        last = tl.where(slot >= 0, num_heads + num_kv_heads, num_heads)
        kv_live = ((heads >= num_heads) & (heads < last))[:, None] & dmask
        kv_head = (heads - num_heads).to(tl.int64)
        dst = cache_ptr + (slot // page_size) * c_page_stride + (slot % page_size) * c_slot_stride
        dst = dst + kv_head[:, None] * c_head_stride + d[None, :]
        cache_ty = cache_ptr.dtype.element_ty
        tl.store(dst, o1.to(cache_ty), mask=kv_live)
        tl.store(dst + half, o2.to(cache_ty), mask=kv_live)
        # The v head of k head num_heads + j is head num_heads + num_kv_heads + j of the row.
        v_ptrs = ptrs + num_kv_heads * head_dim
        v1 = tl.load(v_ptrs, mask=kv_live)
        v2 = tl.load(v_ptrs + half, mask=kv_live)
        tl.store(dst + c_kv_stride, v1.to(cache_ty), mask=kv_live)
        tl.store(dst + c_kv_stride + half, v2.to(cache_ty), mask=kv_live)


def _run(
    qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, kv_cache: torch.Tensor | None, slot_mapping: torch.Tensor | None,
    num_heads: int, num_kv_heads: int, head_dim: int, eps: float, pdl: bool | None,
) -> None:
    """Both ops: their arguments checked, then one launch; kv_cache None: no cache write (slot_mapping unused)."""
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1:
        raise ValueError(f"qk_norm_rope qkv: expected [tokens, {width}] with unit last stride "
                         f"((heads + 2 * kv_heads) * head_dim), got shape {tuple(qkv.shape)} strides {qkv.stride()}")
    if head_dim % 2 != 0:
        raise ValueError(f"qk_norm_rope: head_dim must be even for NeoX RoPE, got {head_dim}")
    if q_weight.shape != (head_dim,) or k_weight.shape != (head_dim,):
        raise ValueError(f"qk_norm_rope: q_weight and k_weight must be [{head_dim}], got "
                         f"{tuple(q_weight.shape)} and {tuple(k_weight.shape)}")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim or cos_sin_cache.stride(1) != 1:
        raise ValueError(f"qk_norm_rope: cos_sin_cache must be [max_pos, {head_dim}] with unit last stride, "
                         f"got shape {tuple(cos_sin_cache.shape)}")
    n_tokens = qkv.shape[0]
    if positions.shape != (n_tokens,):
        raise ValueError(f"qk_norm_rope: positions must be [{n_tokens}], got {tuple(positions.shape)}")
    store = kv_cache is not None
    if store:
        check_kv_cache(kv_cache, num_kv_heads, head_dim)
        if slot_mapping.shape != (n_tokens,):
            raise ValueError(f"qk_norm_rope_store_kv: slot_mapping must be [{n_tokens}], "
                             f"got {tuple(slot_mapping.shape)}")
    if n_tokens == 0:
        return
    # Without a cache the pointer/stride arguments are dead (STORE_KV is a constexpr); pass qkv as a stand-in.
    cache = kv_cache if store else qkv
    slots = slot_mapping if store else positions
    c_strides = kv_cache.stride()[:4] if store else (0, 0, 0, 0)
    page_size = kv_cache.shape[2] if store else 1
    block_half = block_size(head_dim // 2)
    grid = (n_tokens, triton.cdiv(num_heads + num_kv_heads, HEAD_BLOCK))
    on = launch_pdl(qkv, n_tokens, pdl)
    _qk_norm_rope_kernel[grid](
        qkv, q_weight, k_weight, cos_sin_cache, positions, cache, slots,
        qkv.stride(0), cos_sin_cache.stride(0), *c_strides, page_size,
        num_heads, num_kv_heads, head_dim, eps,
        HEAD_BLOCK=HEAD_BLOCK, BLOCK_HALF=block_half, STORE_KV=store, PDL=on,
        num_warps=num_warps_for(HEAD_BLOCK * block_half, max_warps=4), **pdl_launch(on),
    )


def qk_norm_rope(
    qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, pdl: bool | None = None,
) -> None:
    """In place on the q and k heads of qkv; v untouched. pdl: `launch.pdl`'s wanted."""
    _run(qkv, q_weight, k_weight, cos_sin_cache, positions, None, None, num_heads, num_kv_heads, head_dim, eps, pdl)


def qk_norm_rope_store_kv(
    qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int, eps: float, pdl: bool | None = None,
) -> None:
    """qk_norm_rope, then store_kv of the rotated k heads and the v heads, in one launch."""
    _run(qkv, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping,
         num_heads, num_kv_heads, head_dim, eps, pdl)
