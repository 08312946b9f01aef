"""Gated MLP: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

from __future__ import annotations

import torch
from torch import nn

from xrt.attention.context import in_prefill
from xrt.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from xrt.layers.norm import RMSNorm
from xrt.layers.options import DEFAULT_OPTIONS, LayerOptions, uses_pdl
from xrt.ops.parallel_state import SINGLE, TPState


class GatedMLP(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, dtype: torch.dtype, device: torch.device | str,
        tp: TPState = SINGLE, options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__()
        self.pdl_max_rows = options.pdl_max_rows
        self.fuse_activation = options.fuse_activation
        self.fuse_prefill_activation = options.fuse_prefill_activation
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, dtype, device, tp,
                                                       options)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, dtype, device, tp, options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        pdl = uses_pdl(rows, self.pdl_max_rows)
        if self.fuse_activation and x.dim() == 2 and x.is_cuda and rows <= self.gate_up_proj.skinny_rows:
            # Where gate_up_proj would run xrt::linear: the same routing, the activation in the GEMM's epilogue.
            return self.down_proj.forward(torch.ops.xrt.linear_silu_and_mul(x, self.gate_up_proj.weight, pdl))
        if self.fuse_prefill_activation and x.dim() == 2 and rows > self.gate_up_proj.skinny_rows and in_prefill():
            # Prefill passes: one GEMM with the activation in its epilogue on CUDA (on CPU the op's reference, the
            # same two ops as below).
            return self.down_proj.forward(torch.ops.xrt.linear_silu_and_mul(x, self.gate_up_proj.weight, pdl))
        return self.down_proj.forward(torch.ops.xrt.silu_and_mul(self.gate_up_proj(x), pdl))

    def forward_fused(self, stream: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """stream + forward(norm(stream)) for prefill rows (`executor.fuse_prefill_norms`): on CUDA the norm is the
        gate_up GEMM's prologue and the residual add down's epilogue (on CPU the ops' references: the same
        values as the unfused layer)."""
        act = torch.ops.xrt.linear_silu_and_mul(stream, self.gate_up_proj.weight, False, norm.weight, norm.eps)
        return self.down_proj.forward_add(act, stream)
