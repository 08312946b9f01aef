"""Paged-KV ops as `xrt::` ops (`xrt.ops.registry`): the KV write (alone, or fused after qk-norm + RoPE)
and the reference paged attention. The default implementation (every device) is `xrt.ops.reference`;
CUDA overrides come from `xrt.ops.cuda_impls`."""

from __future__ import annotations

import torch

from xrt.ops import reference
from xrt.ops.registry import define


def _store_kv_fake(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    return None


def _qk_norm_rope_store_kv_fake(
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


def _paged_attention_fake(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return torch.empty_like(q)


_STORE_KV = define(
    "store_kv",
    "(Tensor k, Tensor v, Tensor(a2!) kv_cache, Tensor slot_mapping) -> ()",
    reference.store_kv,
    _store_kv_fake,
)
_QK_NORM_ROPE_STORE_KV = define(
    "qk_norm_rope_store_kv",
    "(Tensor(a0!) qkv, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, Tensor positions, "
    "Tensor(a5!) kv_cache, Tensor slot_mapping, SymInt num_heads, SymInt num_kv_heads, SymInt head_dim, "
    "float eps) -> ()",
    reference.qk_norm_rope_store_kv,
    _qk_norm_rope_store_kv_fake,
)
_PAGED_ATTENTION = define(
    "paged_attention",
    "(Tensor q, Tensor kv_cache, Tensor qo_indptr, Tensor kv_indptr, Tensor kv_indices, "
    "Tensor kv_last_page_len, float scale) -> Tensor",
    reference.paged_attention,
    _paged_attention_fake,
)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k/v [T, KV, D] into kv_cache [P, 2, page, KV, D] at slot_mapping[T]; slots < 0 are skipped."""
    _STORE_KV(k, v, kv_cache, slot_mapping)


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
    """qk_norm_rope in place on qkv, then store_kv of its rotated k heads and its v heads."""
    _QK_NORM_ROPE_STORE_KV(
        qkv, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping, num_heads, num_kv_heads,
        head_dim, eps,
    )


def paged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return _PAGED_ATTENTION(q, kv_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, scale)
