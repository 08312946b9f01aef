"""A chunk's bytes: `chunk_tokens` tokens of every layer's K and V, laid out [layers, pages_per_chunk, 2,
page_size, kv_heads, head_dim] (the device cache's own axes with its pages picked out), so gathering a chunk
from the device tensor is one index_select along the page axis and its bytes are contiguous in a tier."""

from __future__ import annotations

import zlib

import attrs
import torch

from xrt.kvcache.device import KVLayout


@attrs.frozen
class ChunkLayout:
    kv: KVLayout
    chunk_tokens: int

    def __attrs_post_init__(self) -> None:
        if self.chunk_tokens % self.kv.page_size:
            raise ValueError(f"cache.chunk_tokens={self.chunk_tokens} must be a multiple of cache.page_size="
                             f"{self.kv.page_size}: a chunk is whole pages")

    @property
    def pages_per_chunk(self) -> int:
        return self.chunk_tokens // self.kv.page_size

    @property
    def shape(self) -> tuple[int, ...]:
        kv = self.kv
        return (kv.num_layers, self.pages_per_chunk, 2, kv.page_size, kv.num_kv_heads, kv.head_dim)

    @property
    def nbytes(self) -> int:
        return self.pages_per_chunk * self.kv.bytes_per_page


def checksum(data: torch.Tensor) -> int:
    """crc32 of a contiguous CPU tensor's bytes. zlib's crc32 runs at ~1.2 GB/s on this 2-core machine (one core;
    README: KV tiers), cheap next to an L2 transfer of the same bytes, and needs no extra dependency; it reads
    the tensor's memory through a numpy view, no copy."""
    if not data.is_contiguous() or data.device.type != "cpu":
        raise ValueError("checksum needs a contiguous CPU tensor")
    return zlib.crc32(data.view(torch.uint8).reshape(-1).numpy())
