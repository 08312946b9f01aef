"""Reference attention backend: the `xrt::paged_attention` op over the paged cache. Works on any
device; the executor uses it on CPU, and on CUDA when FlashInfer is unavailable."""

from __future__ import annotations

import torch

from xrt.attention.metadata import AttentionMetadata
from xrt.ops.attention import paged_attention


class TorchRefBackend:
    def __init__(self) -> None:
        self._meta: AttentionMetadata | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        self._meta = meta

    def forward(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        layer_idx: int,
        scale: float,
        k: torch.Tensor | None = None,
        v: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """k and v are ignored: the reference always reads the paged cache."""
        meta = self._meta
        if meta is None:
            raise RuntimeError("TorchRefBackend.forward called before plan()")
        return paged_attention(
            q, kv_cache, meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, scale
        )
