"""CUDA implementations of the xrt ops: the Triton kernels in `xrt.kernels`.

`xrt.ops` imports this module only when CUDA is present. Importing it registers the kernels but does not
import triton: each implementation imports its kernel module on first call (then finds it in a dict, and
calls the function through the module so a test can still replace it), so a CPU-only process that imports
this file pays nothing. Triton compiles a kernel on its first launch; the executor runs
`xrt.kernels.warmup.warmup_kernels` (or one eager step) before any CUDA graph capture."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from xrt.ops import attention, compute  # noqa: F401  (define the ops registered below)
from xrt.ops.registry import register_device_impl

_MODULES: dict[str, ModuleType] = {}


def _kernels(name: str) -> ModuleType:
    module = _MODULES.get(name)
    if module is None:
        module = _MODULES[name] = importlib.import_module(f"xrt.kernels.{name}")
    return module


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _kernels("rms_norm").rms_norm(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _kernels("rms_norm").fused_add_rms_norm(x, residual, weight, eps)


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
    _kernels("qk_norm_rope").qk_norm_rope(
        qkv, q_weight, k_weight, cos_sin_cache, positions, num_heads, num_kv_heads, head_dim, eps
    )


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
    _kernels("qk_norm_rope").qk_norm_rope_store_kv(
        qkv, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping, num_heads, num_kv_heads, head_dim,
        eps,
    )


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return _kernels("silu_and_mul").silu_and_mul(x)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    _kernels("store_kv").store_kv(k, v, kv_cache, slot_mapping)


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs the skinny GEMM for x's rows and weight [N, K] (the fused prologue ops follow it)."""
    n, k = weight.shape
    return x.dtype in (torch.bfloat16, torch.float16) and _kernels("gemv").prefer_gemv(x.shape[0], n, k)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if gemv_applies(x, weight):
        return _kernels("gemv").gemv(x, weight)
    return torch.mm(x, weight.t())


def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if gemv_applies(x, weight):
        return _kernels("gemv_fused").silu_and_mul_gemv(x, weight)
    return linear(silu_and_mul(x), weight)


def add_rms_norm_linear(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if gemv_applies(x, weight):
        return _kernels("gemv_fused").add_rms_norm_gemv(x, residual, norm_weight, eps, weight)
    # The unfused kernels themselves, bit for bit, on copies (the op writes neither input).
    normed, summed = x.clone(), residual.clone()
    fused_add_rms_norm(normed, summed, norm_weight, eps)
    return linear(normed, weight), summed


IMPLS = {
    "linear": linear,
    "silu_and_mul_linear": silu_and_mul_linear,
    "add_rms_norm_linear": add_rms_norm_linear,
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "qk_norm_rope": qk_norm_rope,
    "qk_norm_rope_store_kv": qk_norm_rope_store_kv,
    "silu_and_mul": silu_and_mul,
    "store_kv": store_kv,
}


def _register() -> None:
    for name, fn in IMPLS.items():
        # Straight into the dispatch table: torch.library.register_kernel would wrap every call in a
        # dynamo guard (microseconds per launch).
        register_device_impl(name, "cuda", fn)


_register()
