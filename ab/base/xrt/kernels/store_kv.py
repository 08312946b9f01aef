"""Paged KV write: k/v [T, KV, D] into kv_cache [P, 2, page, KV, D] at slot_mapping[T] (slot < 0: skip)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import block_size, num_warps_for, pdl, pdl_enter, pdl_launch


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    k_tok_stride,
    k_head_stride,
    v_tok_stride,
    v_head_stride,
    c_page_stride,
    c_kv_stride,
    c_slot_stride,
    c_head_stride,
    page_size,
    head_dim,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    # Padded graph rows carry slot -1: an empty mask (not an early exit) keeps one code path and touches no
    # memory. Written as a bound rather than `& (slot >= 0)`: the interpreter rejects broadcast scalar masks.
    mask = d < tl.where(slot >= 0, head_dim, 0)
    k = tl.load(k_ptr + tok * k_tok_stride + head * k_head_stride + d, mask=mask)
    v = tl.load(v_ptr + tok * v_tok_stride + head * v_head_stride + d, mask=mask)
    dst = cache_ptr + (slot // page_size) * c_page_stride + (slot % page_size) * c_slot_stride
    dst = dst + head * c_head_stride + d
    tl.store(dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + c_kv_stride, v.to(cache_ptr.dtype.element_ty), mask=mask)


def check_kv_cache(kv_cache: torch.Tensor, num_kv_heads: int, head_dim: int) -> None:
    if (kv_cache.dim() != 5 or kv_cache.shape[1] != 2 or kv_cache.shape[3] != num_kv_heads
            or kv_cache.shape[4] != head_dim or kv_cache.stride(4) != 1):
        raise ValueError(f"kv_cache: expected [pages, 2, page_size, {num_kv_heads}, {head_dim}] with unit last "
                         f"stride, got shape {tuple(kv_cache.shape)} strides {kv_cache.stride()}")


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """In place on kv_cache; k and v may be strided views (e.g. slices of the packed qkv)."""
    if k.dim() != 3 or k.shape != v.shape or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError(f"store_kv: expected k and v [tokens, kv_heads, head_dim] of one shape with unit last "
                         f"stride, got {tuple(k.shape)} {k.stride()} and {tuple(v.shape)} {v.stride()}")
    n_tokens, num_kv_heads, head_dim = k.shape
    check_kv_cache(kv_cache, num_kv_heads, head_dim)
    if slot_mapping.shape != (n_tokens,):
        raise ValueError(f"store_kv: slot_mapping must be [{n_tokens}], got {tuple(slot_mapping.shape)}")
    if n_tokens == 0:
        return
    block_d, on = block_size(head_dim), pdl(k, n_tokens)
    _store_kv_kernel[(n_tokens, num_kv_heads)](
        k, v, kv_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        kv_cache.shape[2], head_dim,
        BLOCK_D=block_d, PDL=on, num_warps=num_warps_for(block_d, max_warps=4), **pdl_launch(on),
    )
