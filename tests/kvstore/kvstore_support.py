"""Helpers shared by the kvstore tests: a small chunk layout (2 layers, pages of 4 tokens, chunks of 8 = 2 pages)
and deterministic chunks."""

from __future__ import annotations

import torch

from xrt.kvcache.device import KVLayout
from xrt.kvstore.chunk import ChunkLayout

LAYOUT = ChunkLayout(KVLayout(num_layers=2, page_size=4, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16), 8)


def chunk_of(layout: ChunkLayout, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layout.shape, generator=g).to(layout.kv.dtype)


def key(i: int) -> bytes:
    return i.to_bytes(32, "little")
