"""RMSNorm over the last dimension, plain or fused with the residual add."""

from __future__ import annotations

import torch
from torch import nn

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
