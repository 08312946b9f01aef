"""The prefill's gate_up projection with silu(gate) * up in its epilogue: what `xrt::linear` then
`xrt::silu_and_mul` do, in one launch that writes the [T, I] activation instead of the [T, 2I] projection and
never reads that back.

Grid: (token tiles x column tiles of I), grouped along the tokens (xrt.kernels.gemm_tiles). A program owns
BLOCK_M tokens and BLOCK_N columns j of the intermediate size, and computes both halves they need: gate column j
(weight row j) and up column j (weight row I + j), two accumulators (`gemm_tiles.dual_dot`), so the activation
needs nothing from other programs. Both are rounded to the activation dtype first, as the unfused GEMM's output
would be; from there the numerics are `xrt.kernels.silu_and_mul`'s (fp32, one rounding). Given the norm's weight,
the post-attention RMSNorm before the GEMM is its prologue (`executor.fuse_prefill_norms`, `gemm_tiles`).

Only for prefill-sized launches: a skinny decode batch runs the skinny GEMM (its gated FMA epilogue where it
takes the shape). Not launched with PDL (prefill rows exceed `executor.pdl_max_rows`)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from xrt.kernels.gemm_tiles import check_norm_weight, dual_dot, grouped_tile, rms_scale, tma_dual_dot

# Tokens x intermediate columns per program, K step, warps, stages: two 128 x 64 accumulators (the qkv GEMM's
# dot-per-half shape).
BLOCK_M = 128
BLOCK_N = 64
BLOCK_K = 64
NUM_WARPS = 8
NUM_STAGES = 3
GROUP_M = 8
# The operand tiles by tensor descriptors (Hopper's TMA) instead of pointer loads (off until the bench says).
TMA = False


# The token count is the one argument that changes between calls: not specialised on, so one compile serves all.
@triton.jit(do_not_specialize=["M"])
def _gate_up_kernel(
    x_ptr, w_ptr, out_ptr, norm_ptr, M, K, inter, stride_xm, stride_om, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, TMA: tl.constexpr,
    DOT_FP32: tl.constexpr, NORM: tl.constexpr,
):
    pm, pn = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(inter, BLOCK_N), GROUP_M)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < inter
    if TMA:
        # x_ptr and w_ptr are tensor descriptors ([BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K] blocks): the tiles
        # come in by the copy engine, rows past the ends as zeros (intermediate sizes in whole tiles: `supports`).
        acc_gate, acc_up, ss = tma_dual_dot(x_ptr, w_ptr, pm * BLOCK_M, pn * BLOCK_N, inter + pn * BLOCK_N, K,
                                            norm_ptr, BLOCK_M, BLOCK_N, BLOCK_K, DOT_FP32, NORM)
    else:
        rk = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
        gate_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
        up_ptrs = gate_ptrs + inter.to(tl.int64) * K
        acc_gate, acc_up, ss = dual_dot(x_ptrs, gate_ptrs, up_ptrs, m_ok, n_ok, K, norm_ptr, BLOCK_M, BLOCK_N,
                                        BLOCK_K, DOT_FP32, NORM)
    if NORM:
        acc_gate = rms_scale(acc_gate, ss, K, eps)
        acc_up = rms_scale(acc_up, ss, K, eps)
    dtype = out_ptr.dtype.element_ty
    gate = acc_gate.to(dtype).to(tl.float32)
    up = acc_up.to(dtype).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :], out.to(dtype),
             mask=m_ok[:, None] & n_ok[None, :])


def supports(x: torch.Tensor, block_k: int = BLOCK_K) -> bool:
    """Whether the kernel takes this input: 16-bit activations (tensor cores), a hidden size in whole K steps."""
    return x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 2 and x.shape[1] % block_k == 0


def linear_silu_and_mul(
    x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 1e-6, *,
    block_m: int = BLOCK_M, block_n: int = BLOCK_N, block_k: int = BLOCK_K, num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES, tma: bool = TMA,
) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) for weight = [gate; up] [2I, K] -> [T, I] in x's dtype; with norm_weight [K],
    x's rows RMS-normalised first (eps; the RMSNorm prologue, `xrt.kernels.gemm_tiles`). The tile arguments are
    for the kernel bench and the CPU tests; the defaults are what the op runs. tma: the operand tiles through
    tensor descriptors (the intermediate size must then be a multiple of block_n: a gate tile must not reach into
    the up rows)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"gate_up linear_silu_and_mul x: expected [tokens, hidden] with unit last stride, got "
                         f"shape {tuple(x.shape)} strides {x.stride()}")
    t, k = x.shape
    if (weight.dim() != 2 or weight.shape[1] != k or weight.shape[0] % 2 or not weight.is_contiguous()
            or weight.dtype != x.dtype):
        raise ValueError(f"gate_up linear_silu_and_mul weight: expected a contiguous [2 * intermediate, {k}] "
                         f"{x.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    if not supports(x, block_k):
        raise ValueError(f"gate_up linear_silu_and_mul: expected 16-bit x with a hidden size that is a multiple of "
                         f"{block_k}, got {x.dtype}, hidden {k}")
    check_norm_weight("gate_up linear_silu_and_mul", norm_weight, k)
    inter = weight.shape[0] // 2
    if tma and inter % block_n:
        raise ValueError(f"gate_up linear_silu_and_mul: tma needs the intermediate size in whole {block_n}-column "
                         f"tiles, got {inter}")
    out = x.new_empty(t, inter)
    if t == 0 or inter == 0:
        return out
    # The interpreter's dot multiplies 16-bit floats as their bit patterns: upcast there, never on a GPU.
    dot_fp32 = os.environ.get("TRITON_INTERPRET") == "1"
    grid = (triton.cdiv(t, block_m) * triton.cdiv(inter, block_n),)
    x_arg, w_arg = x, weight
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_arg = TensorDescriptor.from_tensor(x, [block_m, block_k])
        w_arg = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    _gate_up_kernel[grid](
        x_arg, w_arg, out, x if norm_weight is None else norm_weight, t, k, inter, x.stride(0), out.stride(0),
        float(eps), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M, TMA=tma, DOT_FP32=dot_fp32,
        NORM=norm_weight is not None, num_warps=num_warps, num_stages=num_stages,
    )
    return out
