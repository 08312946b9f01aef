"""RMSNorm over the last dimension, plain or fused with the residual add."""

from __future__ import annotations

import torch
from torch import nn

from xrt.layers.options import DEFAULT_OPTIONS, LayerOptions, uses_pdl
from xrt.layers.weights import new_param


class RMSNorm(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float, dtype: torch.dtype, device: torch.device | str,
        options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.pdl_max_rows = options.pdl_max_rows
        self.weight = new_param((hidden_size,), dtype, device)
        self.weight.data.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.weight.shape[0]
        return torch.ops.xrt.rms_norm(x, self.weight, self.eps, uses_pdl(rows, self.pdl_max_rows))

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """residual <- x + residual; x <- norm(residual). Both in place; returns (x, residual)."""
        pdl = uses_pdl(x.shape[0], self.pdl_max_rows)
        torch.ops.xrt.fused_add_rms_norm(x, residual, self.weight, self.eps, pdl)
        return x, residual
