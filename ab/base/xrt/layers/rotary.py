"""Rotary position embedding table, built once in fp32 and shared by every attention layer."""

from __future__ import annotations

import torch
from torch import nn


def build_cos_sin_cache(head_dim: int, max_position: int, base: float, device: torch.device | str) -> torch.Tensor:
    """[max_position, head_dim] fp32: row p = cat(cos(p * inv_freq), sin(p * inv_freq))."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32, device=device), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float, device: torch.device | str) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        self.register_buffer("cos_sin_cache", build_cos_sin_cache(head_dim, max_position, base, device),
                             persistent=False)
