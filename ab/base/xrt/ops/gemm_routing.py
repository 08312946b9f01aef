"""Which GEMM a small matmul runs on CUDA: the layers ask before choosing a fused-prologue op."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch


def uses_skinny_gemm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether xrt::linear on x's rows and weight [N, K] runs the skinny-GEMM kernel (CUDA, 16-bit, a shape
    where it beat cuBLAS): where xrt::silu_and_mul_linear and xrt::add_rms_norm_linear are single kernels
    rather than their composition."""
    return x.is_cuda and _cuda_gemv_applies()(x, weight)


@functools.cache
def _cuda_gemv_applies() -> Callable[[torch.Tensor, torch.Tensor], bool]:
    # Imported on first use: xrt.ops.cuda_impls is only loaded with CUDA present.
    from xrt.ops.cuda_impls import gemv_applies

    return gemv_applies
