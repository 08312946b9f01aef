"""Element-wise and normalisation ops of the model, as `xrt::` custom ops. The default
implementation (every device) is `xrt.ops.reference`; `xrt.ops.cuda_impls` overrides it on CUDA."""

from __future__ import annotations

import torch

from xrt.ops import reference


@torch.library.custom_op("xrt::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return reference.rms_norm(x, weight, eps)


@rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("xrt::fused_add_rms_norm", mutates_args=("x", "residual"))
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    reference.fused_add_rms_norm(x, residual, weight, eps)


@fused_add_rms_norm.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    return None


@torch.library.custom_op("xrt::qk_norm_rope", mutates_args=("qkv",))
def qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> None:
    reference.qk_norm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_heads, num_kv_heads, head_dim, eps)


@qk_norm_rope.register_fake
def _(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> None:
    return None


@torch.library.custom_op("xrt::silu_and_mul", mutates_args=())
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return reference.silu_and_mul(x)


@silu_and_mul.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))
