"""RMSNorm over the last dimension, plain or fused with the residual add (and with the linear layer after it,
where that layer runs the skinny GEMM)."""

from __future__ import annotations

import torch
from torch import nn

from xrt.layers.linear import ColumnParallelLinear
from xrt.layers.weights import new_param


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param((hidden_size,), dtype, device)
        self.weight.data.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.xrt.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """residual <- x + residual; x <- norm(residual). Both in place; returns (x, residual)."""
        torch.ops.xrt.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x, residual

    def add_forward_linear(
        self, x: torch.Tensor, residual: torch.Tensor, linear: ColumnParallelLinear
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """add_forward then `linear` on the normed rows: returns (linear output, new residual). One kernel where
        linear runs the skinny GEMM (`linear.fuses_prologue`), which leaves x and residual untouched and returns
        the new residual in a new tensor; otherwise add_forward's in-place update."""
        if linear.fuses_prologue(x):
            return torch.ops.xrt.add_rms_norm_linear(x, residual, self.weight, self.eps, linear.weight)
        x, residual = self.add_forward(x, residual)
        return linear(x), residual
