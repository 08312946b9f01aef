"""Element-wise and normalisation ops of the model, as `xrt::` ops (`xrt.ops.registry`). The default
implementation (every device) is `xrt.ops.reference`; `xrt.ops.cuda_impls` overrides it on CUDA.
Each function here calls its op's overload: the dispatcher picks the implementation by device."""

from __future__ import annotations

import functools
from collections.abc import Callable

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


def _silu_and_mul_linear_fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def _add_rms_norm_linear_fake(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty((x.shape[0], weight.shape[0])), torch.empty_like(x)


_LINEAR = define("linear", "(Tensor x, Tensor weight) -> Tensor", reference.linear, _linear_fake)
_SILU_AND_MUL = define("silu_and_mul", "(Tensor x) -> Tensor", reference.silu_and_mul, _silu_and_mul_fake)
_SILU_AND_MUL_LINEAR = define(
    "silu_and_mul_linear", "(Tensor x, Tensor weight) -> Tensor", reference.silu_and_mul_linear,
    _silu_and_mul_linear_fake,
)
_ADD_RMS_NORM_LINEAR = define(
    "add_rms_norm_linear",
    "(Tensor x, Tensor residual, Tensor norm_weight, float eps, Tensor weight) -> (Tensor, Tensor)",
    reference.add_rms_norm_linear,
    _add_rms_norm_linear_fake,
)


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


def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """linear(silu_and_mul(x), weight), x [M, 2I], weight [N, I]: on CUDA one skinny-GEMM kernel computing the
    activation as it loads x, where xrt::linear would run the skinny GEMM (`uses_skinny_gemm`)."""
    return _SILU_AND_MUL_LINEAR(x, weight)


def add_rms_norm_linear(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual -> (linear(rms_norm(h) * norm_weight, weight), h), both new tensors (x and residual are
    only read): fused_add_rms_norm then linear, on CUDA one skinny-GEMM kernel where xrt::linear would run it."""
    return _ADD_RMS_NORM_LINEAR(x, residual, norm_weight, eps, weight)


def uses_skinny_gemm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether xrt::linear on x's rows and weight [N, K] runs the skinny-GEMM kernel (CUDA, 16-bit, a shape
    where it beat cuBLAS): where the two ops above are single kernels rather than their composition."""
    return x.is_cuda and _cuda_gemv_applies()(x, weight)


@functools.cache
def _cuda_gemv_applies() -> Callable[[torch.Tensor, torch.Tensor], bool]:
    # Imported on first use: xrt.ops.cuda_impls imports this module, and is only loaded with CUDA present.
    from xrt.ops.cuda_impls import gemv_applies

    return gemv_applies
