"""The prefill's row-parallel projections (o_proj, down) with the residual add in their epilogue: what `xrt::linear`
then the add of `xrt::fused_add_rms_norm` do, in one launch that writes the new residual stream. The norm that
followed the add is the next GEMM's prologue (`executor.fuse_prefill_norms`, `gemm_tiles`), so the stream is
written once a sublayer and read by the two GEMMs that need it (the next one's activations, the next add's
residual), never by a norm kernel.

Grid: (token tiles x column tiles), grouped along the tokens (`gemm_tiles.grouped_tile`). The product is rounded to
the activation dtype before the add, as the unfused GEMM's output would be, and the sum rounded once (the
reference's add in the activation dtype). One rank only: with tensor parallelism the add follows the all-reduce
(`RowParallelLinear.forward_add`). Not launched with PDL (prefill rows exceed `executor.pdl_max_rows`)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from xrt.kernels.gemm_tiles import grouped_tile, single_dot, tma_dot
from xrt.kernels.launch import sm_count

# Tokens x output columns per program, K step, warps, stages: cuBLAS's 128 x 128-class tile on tensor cores.
BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 64
NUM_WARPS = 8
NUM_STAGES = 3
GROUP_M = 8
# Where those tiles would not fill the GPU once (a narrow output at ~1k tokens: 0.6B's o_proj and down are 64 tiles
# at 1024 tokens), half as many tokens a program and half the warps, so twice the programs.
SMALL_BLOCK_M = 64
SMALL_NUM_WARPS = 4
# The operand tiles by tensor descriptors (Hopper's TMA) instead of pointer loads (off until the bench says).
TMA = False


# The token count is the one argument that changes between calls: not specialised on, so one compile serves all.
@triton.jit(do_not_specialize=["M"])
def _linear_add_kernel(
    x_ptr, w_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_rm, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_FP32: tl.constexpr, TMA: tl.constexpr,
):
    pm, pn = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    if TMA:
        # x_ptr and w_ptr are tensor descriptors ([BLOCK_M, BLOCK_K] and [BLOCK_N, BLOCK_K] blocks): rows past the
        # ends come in as zeros. No norm (x_ptr stands in for its weight).
        acc, _ = tma_dot(x_ptr, w_ptr, pm * BLOCK_M, pn * BLOCK_N, K, x_ptr, BLOCK_M, BLOCK_N, BLOCK_K, DOT_FP32, False)
    else:
        x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
        w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
        # K is a multiple of BLOCK_K (`supports`); no norm (x_ptr stands in for its weight).
        acc, _ = single_dot(x_ptrs, w_ptrs, m_ok, n_ok, K, x_ptr, BLOCK_M, BLOCK_N, BLOCK_K, DOT_FP32, False, True)
    dtype = out_ptr.dtype.element_ty
    mask = m_ok[:, None] & n_ok[None, :]
    res = tl.load(res_ptr + rm[:, None].to(tl.int64) * stride_rm + rn[None, :], mask=mask, other=0.0)
    out = acc.to(dtype).to(tl.float32) + res.to(tl.float32)
    tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :], out.to(dtype), mask=mask)


def supports(x: torch.Tensor, block_k: int = BLOCK_K) -> bool:
    """Whether the kernel takes this input: 16-bit activations (tensor cores), an input size in whole K steps."""
    return x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 2 and x.shape[1] % block_k == 0


def linear_add(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, *, block_m: int | None = None,
    block_n: int = BLOCK_N, block_k: int = BLOCK_K, num_warps: int | None = None, num_stages: int = NUM_STAGES,
    tma: bool = TMA,
) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T + residual [T, N] -> [T, N] in x's dtype (a new tensor). The tile arguments are
    for the kernel bench and the CPU tests; the defaults are what the op runs (block_m and num_warps: BLOCK_M and
    NUM_WARPS, or the small tile where those fall short of one wave on the GPU). Each token count picks its tile
    from static sizes, so a prefill graph's warm-up compiles what its capture runs. tma: the operand tiles through
    tensor descriptors."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"linear_add x: expected [tokens, input] with unit last stride, got shape "
                         f"{tuple(x.shape)} strides {x.stride()}")
    t, k = x.shape
    if weight.dim() != 2 or weight.shape[1] != k or not weight.is_contiguous() or weight.dtype != x.dtype:
        raise ValueError(f"linear_add weight: expected a contiguous [output, {k}] {x.dtype}, got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    n = weight.shape[0]
    if tuple(residual.shape) != (t, n) or residual.stride(1) != 1 or residual.dtype != x.dtype:
        raise ValueError(f"linear_add residual: expected [{t}, {n}] {x.dtype} with unit last stride, got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    if not supports(x, block_k):
        raise ValueError(f"linear_add: expected 16-bit x with an input size that is a multiple of {block_k}, got "
                         f"{x.dtype}, input {k}")
    out = x.new_empty(t, n)
    if t == 0 or n == 0:
        return out
    if block_m is None:
        small = x.is_cuda and triton.cdiv(t, BLOCK_M) * triton.cdiv(n, block_n) < sm_count(x.device.index)
        block_m = SMALL_BLOCK_M if small else BLOCK_M
        if num_warps is None:
            num_warps = SMALL_NUM_WARPS if small else NUM_WARPS
    num_warps = NUM_WARPS if num_warps is None else num_warps
    # The interpreter's dot multiplies 16-bit floats as their bit patterns: upcast there, never on a GPU.
    dot_fp32 = os.environ.get("TRITON_INTERPRET") == "1"
    grid = (triton.cdiv(t, block_m) * triton.cdiv(n, block_n),)
    x_arg, w_arg = x, weight
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        x_arg = TensorDescriptor.from_tensor(x, [block_m, block_k])
        w_arg = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    _linear_add_kernel[grid](
        x_arg, w_arg, residual, out, t, n, k, x.stride(0), residual.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M, DOT_FP32=dot_fp32, TMA=tma,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
