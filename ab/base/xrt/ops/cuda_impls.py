"""CUDA implementations of the xrt ops: the Triton kernels in `xrt.kernels`, registered by op name.

`xrt.ops` imports this module only when CUDA is present. Registering does not import triton: each kernel
module is imported on its op's first call (`registry.lazy_function`), so a process that never launches
one pays nothing. Triton compiles a kernel on its first launch; the executor runs
`xrt.kernels.warmup.warmup_kernels` (or one eager step) before any CUDA graph capture."""

from __future__ import annotations

import torch

from xrt.ops import reference  # noqa: F401  (declares the ops registered below)
from xrt.ops.registry import implementation, lazy_function, register_device_impl, register_kernels

# Ops whose kernel takes the op's arguments as they are: op name -> kernels module.function.
KERNELS = {
    "rms_norm": "rms_norm.rms_norm",
    "fused_add_rms_norm": "rms_norm.fused_add_rms_norm",
    "qk_norm_rope": "qk_norm_rope.qk_norm_rope",
    "qk_norm_rope_store_kv": "qk_norm_rope.qk_norm_rope_store_kv",
    "silu_and_mul": "silu_and_mul.silu_and_mul",
    "store_kv": "store_kv.store_kv",
}
register_kernels("cuda", "xrt.kernels", KERNELS)
# Called directly, not through the dispatcher: also on CPU tensors under TRITON_INTERPRET, as tests do.
_silu_and_mul = implementation("silu_and_mul", "cuda")
_fused_add_rms_norm = implementation("fused_add_rms_norm", "cuda")

_prefer_gemv = lazy_function("xrt.kernels.gemv", "prefer_gemv")
_gemv = lazy_function("xrt.kernels.gemv", "gemv")
_silu_and_mul_gemv = lazy_function("xrt.kernels.gemv_fused", "silu_and_mul_gemv")
_add_rms_norm_gemv = lazy_function("xrt.kernels.gemv_fused", "add_rms_norm_gemv")


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear` runs the skinny GEMM for x's rows and weight [N, K] (the fused prologue ops follow it)."""
    n, k = weight.shape
    return x.dtype in (torch.bfloat16, torch.float16) and bool(_prefer_gemv(x.shape[0], n, k))


# The GEMM ops choose between the skinny GEMM and cuBLAS (or the unfused kernels) by shape.
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if gemv_applies(x, weight):
        return _gemv(x, weight)
    return torch.mm(x, weight.t())


def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if gemv_applies(x, weight):
        return _silu_and_mul_gemv(x, weight)
    return linear(_silu_and_mul(x), weight)


def add_rms_norm_linear(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if gemv_applies(x, weight):
        return _add_rms_norm_gemv(x, residual, norm_weight, eps, weight)
    # The unfused kernels themselves, bit for bit, on copies (the op writes neither input).
    normed, summed = x.clone(), residual.clone()
    _fused_add_rms_norm(normed, summed, norm_weight, eps)
    return linear(normed, weight), summed


for _fn in (linear, silu_and_mul_linear, add_rms_norm_linear):
    register_device_impl(_fn.__name__, "cuda", _fn)
