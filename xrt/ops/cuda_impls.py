"""CUDA implementations of the xrt ops: the Triton kernels in `xrt.kernels`, registered by op name.

`xrt.ops` imports this module only when CUDA is present. Registering does not import triton: each kernel
module is imported on its op's first call (`registry.lazy_function`), so a process that never launches
one pays nothing. Triton compiles a kernel on its first launch; the executor runs
`xrt.kernels.warmup.warmup_kernels` (or one eager step) before any CUDA graph capture."""

from __future__ import annotations

import torch

from xrt.ops import reference  # noqa: F401  (declares the ops registered below)
from xrt.ops.registry import lazy_function, register_device_impl, register_kernels

# Ops whose kernel takes the op's arguments as they are (`pdl` last, left out where the caller passed the
# default): op name -> kernels module.function.
KERNELS = {
    "argmax_rows": "argmax.argmax_rows",
    "rms_norm": "rms_norm.rms_norm",
    "fused_add_rms_norm": "rms_norm.fused_add_rms_norm",
    "qk_norm_rope": "qk_norm_rope.qk_norm_rope",
    "qk_norm_rope_store_kv": "qk_norm_rope.qk_norm_rope_store_kv",
    "silu_and_mul": "silu_and_mul.silu_and_mul",
    "store_kv": "store_kv.store_kv",
}
register_kernels("cuda", "xrt.kernels", KERNELS)

_prefer_gemv = lazy_function("xrt.kernels.gemv", "prefer_gemv")
_gemv = lazy_function("xrt.kernels.gemv", "gemv")
_pick_config = lazy_function("xrt.kernels.gemv", "pick_config")


def linear(x: torch.Tensor, weight: torch.Tensor, pdl: bool | None = None) -> torch.Tensor:
    """The skinny GEMM where it measured faster than cuBLAS for x's rows and weight [N, K] (16-bit), else cuBLAS
    (which takes no part in PDL)."""
    n, k = weight.shape
    if x.dtype in (torch.bfloat16, torch.float16) and bool(_prefer_gemv(x.shape[0], n, k)):
        return _gemv(x, weight, None, None, pdl)
    return torch.mm(x, weight.t())


register_device_impl("linear", "cuda", linear)

_silu_and_mul = lazy_function("xrt.kernels.silu_and_mul", "silu_and_mul")
_rms_norm = lazy_function("xrt.kernels.rms_norm", "rms_norm")


def _on_fma_path(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether xrt::linear runs x @ weight^T on the skinny GEMM's FMA path, where its gated epilogue applies (on
    the tensor-core path it measured slower: Qwen3-8B at batch 8, bench/NOTES.md)."""
    m, (n, k) = x.shape[0], weight.shape
    return (x.dtype in (torch.bfloat16, torch.float16) and bool(_prefer_gemv(m, n, k))
            and not _pick_config(m, n, k).use_dot)


_gate_up_supports = lazy_function("xrt.kernels.gate_up_gemm", "supports")
_gate_up_gemm = lazy_function("xrt.kernels.gate_up_gemm", "linear_silu_and_mul")
# The skinny GEMM's largest batch (xrt.kernels.gemv_configs: M <= 8); above it xrt::linear is cuBLAS.
_SKINNY_MAX_ROWS = 8


def linear_silu_and_mul(x: torch.Tensor, weight: torch.Tensor, pdl: bool | None = None,
                        norm_weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Past the skinny GEMM's batches (prefill, `executor.fuse_prefill_activation`): the Triton GEMM with the
    activation in its epilogue and norm_weight's RMSNorm, if any, as its prologue (`xrt.kernels.gate_up_gemm`)
    where it takes the input. Elsewhere the norm first (its kernel), then: where the skinny GEMM runs the gate_up
    shape on its FMA path one launch, silu(gate) * up its epilogue; else the two apart, as xrt::linear then
    silu_and_mul."""
    if x.shape[0] > _SKINNY_MAX_ROWS and bool(_gate_up_supports(x)):
        return _gate_up_gemm(x, weight, norm_weight, eps)
    if norm_weight is not None:
        x = _rms_norm(x, norm_weight, eps, pdl)
    if _on_fma_path(x, weight):
        return _gemv(x, weight, None, None, pdl, True)
    return _silu_and_mul(linear(x, weight, pdl), pdl)


register_device_impl("linear_silu_and_mul", "cuda", linear_silu_and_mul)

_qkv_supports = lazy_function("xrt.kernels.qkv_gemm", "supports")
_qkv_gemm = lazy_function("xrt.kernels.qkv_gemm", "linear_qk_norm_rope_store_kv")
_qk_norm_rope_store_kv = lazy_function("xrt.kernels.qk_norm_rope", "qk_norm_rope_store_kv")


def linear_qk_norm_rope_store_kv(
    x: torch.Tensor, weight: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int, eps: float, norm_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """One GEMM with norm_weight's RMSNorm, if any, as its prologue and the q/k norm, RoPE and KV write in its
    epilogue (`xrt.kernels.qkv_gemm`) where it takes the shape; elsewhere the rms_norm kernel, xrt::linear, then
    the qk_norm_rope_store_kv kernel."""
    if bool(_qkv_supports(x, head_dim)):
        return _qkv_gemm(x, weight, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping,
                         num_heads, num_kv_heads, head_dim, eps, norm_weight)
    if norm_weight is not None:
        x = _rms_norm(x, norm_weight, eps)
    qkv = linear(x, weight)
    _qk_norm_rope_store_kv(qkv, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping, num_heads,
                           num_kv_heads, head_dim, eps)
    return qkv


register_device_impl("linear_qk_norm_rope_store_kv", "cuda", linear_qk_norm_rope_store_kv)

_residual_supports = lazy_function("xrt.kernels.residual_gemm", "supports")
_residual_gemm = lazy_function("xrt.kernels.residual_gemm", "linear_add")


def linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """Past the skinny GEMM's batches: one Triton GEMM with the residual add in its epilogue
    (`xrt.kernels.residual_gemm`) where it takes the input; elsewhere xrt::linear, then the add."""
    if x.shape[0] > _SKINNY_MAX_ROWS and bool(_residual_supports(x)):
        return _residual_gemm(x, weight, residual)
    return linear(x, weight) + residual


register_device_impl("linear_add", "cuda", linear_add)
