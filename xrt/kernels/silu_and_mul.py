"""silu(gate) * up over the fused gate_up projection output [T, 2I] -> [T, I].

Numerics follow xrt.ops.reference: computed in fp32, rounded once to the output dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import block_size, num_warps_for

# Columns per program: a few programs per row keep the GPU busy at batch 1 (I = 3072 -> 6 programs).
_MAX_BLOCK = 512


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    x_row_stride,
    out_row_stride,
    n_cols,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = x_ptr + row * x_row_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] -> new [T, I] in x's dtype."""
    if x.dim() != 2 or x.shape[1] % 2 != 0 or x.stride(1) != 1:
        raise ValueError(f"silu_and_mul: expected a [tokens, 2 * intermediate] tensor with unit last stride, "
                         f"got shape {tuple(x.shape)} strides {x.stride()}")
    n_tokens, n_cols = x.shape[0], x.shape[1] // 2
    out = torch.empty((n_tokens, n_cols), dtype=x.dtype, device=x.device)
    if n_tokens == 0 or n_cols == 0:
        return out
    block = min(block_size(n_cols), _MAX_BLOCK)
    grid = (n_tokens, triton.cdiv(n_cols, block))
    _silu_and_mul_kernel[grid](x, out, x.stride(0), out.stride(0), n_cols, BLOCK=block, num_warps=num_warps_for(block))
    return out
