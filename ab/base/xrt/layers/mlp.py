"""Gated MLP: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

from __future__ import annotations

import torch
from torch import nn

from xrt.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, dtype, device)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_forward(self.gate_up_proj(x))

    def down_forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The rest of the MLP from an already computed gate_up projection (as RMSNorm.add_forward_linear gives
        it): the activation and the down projection, fused where the down projection runs the skinny GEMM."""
        return self.down_proj.silu_and_mul_forward(gate_up)
