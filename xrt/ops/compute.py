"""Element-wise and normalisation ops of the model, as `xrt::` ops (`xrt.ops.registry`). The default
implementation (every device) is `xrt.ops.reference`; `xrt.ops.cuda_impls` overrides it on CUDA.
Each function here calls its op's overload: the dispatcher picks the implementation by device."""

from __future__ import annotations

import torch

from xrt.ops import reference
from xrt.ops.registry import define


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


def _fused_add_rms_norm_fake(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    return None


def _qk_norm_rope_fake(
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


def _silu_and_mul_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


_RMS_NORM = define("rms_norm", "(Tensor x, Tensor weight, float eps) -> Tensor", reference.rms_norm, _rms_norm_fake)
_FUSED_ADD_RMS_NORM = define(
    "fused_add_rms_norm",
    "(Tensor(a0!) x, Tensor(a1!) residual, Tensor weight, float eps) -> ()",
    reference.fused_add_rms_norm,
    _fused_add_rms_norm_fake,
)
_QK_NORM_ROPE = define(
    "qk_norm_rope",
    "(Tensor(a0!) qkv, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, Tensor positions, "
    "SymInt num_heads, SymInt num_kv_heads, SymInt head_dim, float eps) -> ()",
    reference.qk_norm_rope,
    _qk_norm_rope_fake,
)
def _linear_fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


_LINEAR = define("linear", "(Tensor x, Tensor weight) -> Tensor", reference.linear, _linear_fake)
_SILU_AND_MUL = define("silu_and_mul", "(Tensor x) -> Tensor", reference.silu_and_mul, _silu_and_mul_fake)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _RMS_NORM(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual <- x + residual; x <- rms_norm(residual) * weight."""
    _FUSED_ADD_RMS_NORM(x, residual, weight, eps)


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
    """In place on the q and k heads of qkv [T, (H + 2 KV) * D]: per-head RMSNorm, then NeoX RoPE."""
    _QK_NORM_ROPE(qkv, q_weight, k_weight, cos_sin_cache, positions, num_heads, num_kv_heads, head_dim, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _SILU_AND_MUL(x)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T. On CUDA, small M runs the skinny-GEMM kernel where it beats cuBLAS."""
    return _LINEAR(x, weight)
