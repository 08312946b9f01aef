"""silu(gate) * up over the fused gate_up projection output [T, 2I] -> [T, I].

Numerics follow xrt.ops.reference: computed in fp32, rounded once to the output dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import block_size, num_warps_for, pdl, pdl_enter, pdl_launch

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
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x_row = x_ptr + row * x_row_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] -> new [..., I] in x's dtype."""
    if x.dim() == 0 or x.shape[-1] % 2 != 0:
        raise ValueError(f"silu_and_mul: last dimension must be 2 * intermediate (even), got {tuple(x.shape)}")
    n_cols = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * n_cols)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], n_cols), dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0 and n_cols > 0:
        block = min(block_size(n_cols), _MAX_BLOCK)
        grid = (rows.shape[0], triton.cdiv(n_cols, block))
        on = pdl(x, rows.shape[0])
        _silu_and_mul_kernel[grid](
            rows, out, rows.stride(0), out.stride(0), n_cols, BLOCK=block, PDL=on,
            num_warps=num_warps_for(block), **pdl_launch(on),
        )
    return out.view(*x.shape[:-1], n_cols)
