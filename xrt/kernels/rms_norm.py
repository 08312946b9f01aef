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
                               x_out_ptr, res_out_ptr, x_out_row_stride, res_out_row_stride,
                               BLOCK: tl.constexpr, OUT_OF_PLACE: tl.constexpr, PDL: tl.constexpr):
    # The out-of-place arguments last, and read only when OUT_OF_PLACE: the in-place kernel is the one it always was.
    row, cols, mask = _enter_row(n_cols, BLOCK, PDL)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if OUT_OF_PLACE:
        x_dst = x_out_ptr + row * x_out_row_stride + cols
        res_dst = res_out_ptr + row * res_out_row_stride + cols
    else:
        x_dst = x_ptr + row * x_row_stride + cols
        res_dst = res_ptr + row * res_row_stride + cols
    # Round the sum to the residual dtype before normalising: the stored residual is what the
    # reference (and the next layer) sees.
    s = (x + r).to(res_ptr.dtype.element_ty)
    tl.store(res_dst, s, mask=mask)
    s32 = s.to(tl.float32)
    rstd, w = _norm_factors(s32, w_ptr, cols, mask, n_cols, eps)
    tl.store(x_dst, (s32 * rstd * w).to(x_ptr.dtype.element_ty), mask=mask)


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
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, pdl: bool | None = None,
    out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None,
) -> None:
    """One launch: residual <- x + residual; x <- rms_norm(residual) * weight, in place, or (out, residual_out)
    into those [tokens, N] tensors instead, the inputs left as they are."""
    n_cols = weight.shape[0]
    if (out is None) != (residual_out is None):
        raise ValueError("fused_add_rms_norm: give both out and residual_out, or neither (in place)")
    out_of_place = out is not None
    out = x if out is None else out
    residual_out = residual if residual_out is None else residual_out
    for name, t, like in (("x", x, x), ("residual", residual, residual), ("out", out, x),
                          ("residual_out", residual_out, residual)):
        _check_rows(f"fused_add_rms_norm {name}", t, n_cols)
        if t.shape[0] != x.shape[0] or t.dtype != like.dtype:
            raise ValueError(f"fused_add_rms_norm {name}: expected {x.shape[0]} rows of {like.dtype}, got "
                             f"{t.shape[0]} of {t.dtype}")
    if x.shape[0] == 0:
        return
    block, on = block_size(n_cols), launch_pdl(x, x.shape[0], pdl)
    _fused_add_rms_norm_kernel[(x.shape[0],)](
        x, residual, weight, x.stride(0), residual.stride(0), n_cols, eps, out, residual_out, out.stride(0),
        residual_out.stride(0), BLOCK=block, OUT_OF_PLACE=out_of_place, PDL=on, num_warps=num_warps_for(block),
        **pdl_launch(on),
    )
