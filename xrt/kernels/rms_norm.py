"""RMSNorm and fused residual-add + RMSNorm, one program per token row.

Numerics follow xrt.ops.reference: normalised and scaled by the weight in fp32, rounded once to the
output dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xrt.kernels.launch import block_size, num_warps_for, pdl_enter, pdl_launch
from xrt.kernels.launch import pdl as launch_pdl


@triton.jit
def _enter_row(n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Both kernels' start: pdl_enter (before any load), then this program's row, its BLOCK columns and their mask
    (those < n_cols)."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    return row, cols, cols < n_cols


@triton.jit
def _norm_factors(x, w_ptr, cols, mask, n_cols, eps):
    """The factors of x (an fp32 row of BLOCK, zero past n_cols) normalised: 1 / RMS(x) and the weight, fp32."""
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return rstd, w


@triton.jit
def _rms_norm_kernel(x_ptr, out_ptr, w_ptr, x_row_stride, out_row_stride, n_cols, eps,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    row, cols, mask = _enter_row(n_cols, BLOCK, PDL)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd, w = _norm_factors(x, w_ptr, cols, mask, n_cols, eps)
    tl.store(out_ptr + row * out_row_stride + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fused_add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, x_row_stride, res_row_stride, n_cols, eps,
                               BLOCK: tl.constexpr, PDL: tl.constexpr):
    row, cols, mask = _enter_row(n_cols, BLOCK, PDL)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    # Round the sum to the residual dtype before normalising: the stored residual is what the
    # reference (and the next layer) sees.
    s = (x + r).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + row * res_row_stride + cols, s, mask=mask)
    s32 = s.to(tl.float32)
    rstd, w = _norm_factors(s32, w_ptr, cols, mask, n_cols, eps)
    tl.store(x_ptr + row * x_row_stride + cols, (s32 * rstd * w).to(x_ptr.dtype.element_ty), mask=mask)


def _check_rows(name: str, t: torch.Tensor, n_cols: int) -> None:
    if t.dim() != 2 or t.shape[1] != n_cols or t.stride(1) != 1:
        raise ValueError(f"{name}: expected a [tokens, {n_cols}] tensor with unit last stride, got "
                         f"shape {tuple(t.shape)} strides {t.stride()}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool | None = None) -> torch.Tensor:
    """x [..., N], weight [N] -> new tensor of x's shape and dtype. pdl: `launch.pdl`'s wanted."""
    n_cols = weight.shape[0]
    if x.dim() == 0 or x.shape[-1] != n_cols:
        raise ValueError(f"rms_norm: x must end in the weight's size {n_cols}, got shape {tuple(x.shape)}")
    rows = x.reshape(-1, n_cols)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0:
        block, on = block_size(n_cols), launch_pdl(x, rows.shape[0], pdl)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, out, weight, rows.stride(0), out.stride(0), n_cols, eps, BLOCK=block, PDL=on,
            num_warps=num_warps_for(block), **pdl_launch(on),
        )
    return out.view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool | None = None
) -> None:
    """In place, one launch: residual <- x + residual; x <- rms_norm(residual) * weight."""
    n_cols = weight.shape[0]
    _check_rows("fused_add_rms_norm x", x, n_cols)
    _check_rows("fused_add_rms_norm residual", residual, n_cols)
    if x.shape[0] != residual.shape[0]:
        raise ValueError(f"fused_add_rms_norm: x has {x.shape[0]} rows, residual {residual.shape[0]}")
    if x.shape[0] == 0:
        return
    block, on = block_size(n_cols), launch_pdl(x, x.shape[0], pdl)
    _fused_add_rms_norm_kernel[(x.shape[0],)](
        x, residual, weight, x.stride(0), residual.stride(0), n_cols, eps, BLOCK=block, PDL=on,
        num_warps=num_warps_for(block), **pdl_launch(on),
    )
