"""CUDA implementations of the xrt ops: the Triton kernels in `xrt.kernels`.

`xrt.ops` imports this module only when CUDA is present. Importing it registers the kernels but does not
import triton: each implementation imports its kernel on first call, so a CPU-only process that imports
this file pays nothing. Triton compiles a kernel on its first launch; the executor runs
`xrt.kernels.warmup.warmup_kernels` (or one eager step) before any CUDA graph capture."""

from __future__ import annotations

import torch

from xrt.ops import compute  # noqa: F401  (defines the ops registered below)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from xrt.kernels.rms_norm import rms_norm as kernel

    return kernel(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    from xrt.kernels.rms_norm import fused_add_rms_norm as kernel

    kernel(x, residual, weight, eps)


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
    from xrt.kernels.qk_norm_rope import qk_norm_rope as kernel

    kernel(qkv, q_weight, k_weight, cos_sin_cache, positions, num_heads, num_kv_heads, head_dim, eps)


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
    from xrt.kernels.qk_norm_rope import qk_norm_rope_store_kv as kernel

    kernel(qkv, q_weight, k_weight, cos_sin_cache, positions, kv_cache, slot_mapping,
           num_heads, num_kv_heads, head_dim, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    from xrt.kernels.silu_and_mul import silu_and_mul as kernel

    return kernel(x)


def store_kv(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    from xrt.kernels.store_kv import store_kv as kernel

    kernel(k, v, kv_cache, slot_mapping)


IMPLS = {
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "qk_norm_rope": qk_norm_rope,
    "qk_norm_rope_store_kv": qk_norm_rope_store_kv,
    "silu_and_mul": silu_and_mul,
    "store_kv": store_kv,
}


def _register() -> None:
    for name, fn in IMPLS.items():
        # An op not (yet) defined in xrt.ops has nothing to override.
        if hasattr(torch.ops.xrt, name):
            torch.library.register_kernel(f"xrt::{name}", "cuda", fn)


_register()
