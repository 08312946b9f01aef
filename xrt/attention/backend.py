"""The interface every attention backend implements. The executor picks one (torch reference
on CPU, FlashInfer on CUDA) and puts it in the forward context; layers call it without knowing
which it is."""

from __future__ import annotations

from typing import Protocol

import torch

from xrt.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare for one step (FlashInfer planning, from the *_host tensors). Called once per step,
        before the forward pass and outside any CUDA graph capture."""

    def forward(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        layer_idx: int,
        scale: float,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [num_tokens, num_heads, head_dim]; kv_cache: this layer's paged cache, already holding this
        step's K/V. Returns [num_tokens, num_heads, head_dim], causal over each sequence's full KV.
        k, v: this step's keys and values [num_tokens, num_kv_heads, head_dim] (the same values the cache
        received, possibly strided views); a backend may attend over them instead of the cache when no
        sequence has KV from an earlier step, and is free to ignore them."""
