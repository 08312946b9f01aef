"""Paged-KV ops as `xrt::` custom ops: the KV write (alone, or fused after qk-norm + RoPE) and
the reference paged attention. The default implementation (every device) is `xrt.ops.reference`;
CUDA overrides come from `xrt.ops.cuda_impls`."""

from __future__ import annotations

import torch

from xrt.ops import reference


@torch.library.custom_op("xrt::store_kv", mutates_args=("kv_cache",))
def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    reference.store_kv(k, v, kv_cache, slot_mapping)


@store_kv.register_fake
def _(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    return None


@torch.library.custom_op("xrt::qk_norm_rope_store_kv", mutates_args=("qkv", "kv_cache"))
def qk_norm_rope_store_kv(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> None:
    reference.qk_norm_rope_store_kv(
        qkv, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping, num_heads, num_kv_heads, head_dim,
        eps,
    )


@qk_norm_rope_store_kv.register_fake
def _(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> None:
    return None


@torch.library.custom_op("xrt::paged_attention", mutates_args=())
def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return reference.paged_attention(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, scale)


@paged_attention.register_fake
def _(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return torch.empty_like(q)
