"""The KV cache on the device: one tensor [layers, pages, 2, page_size, kv_heads, head_dim] (index 0 of the
third axis K, 1 V: FlashInfer's NHD layout per layer), each attention layer bound to its own view of it.
How many pages it holds is decided by `xrt.kvcache.sizing`; which pages a sequence owns by the host side
(`xrt.kvcache.manager`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class KVLayer(Protocol):
    """What the KV cache needs of an attention layer (`xrt.layers.attention.PagedAttention`)."""

    layer_idx: int
    num_kv_heads: int
    head_dim: int
    kv_cache: torch.Tensor


@dataclass(frozen=True)
class KVLayout:
    """The shape of one model's paged KV cache."""

    num_layers: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, layers: Sequence[KVLayer], page_size: int, dtype: torch.dtype) -> KVLayout:
        first = layers[0]
        return cls(len(layers), page_size, first.num_kv_heads, first.head_dim, dtype)

    @property
    def bytes_per_page(self) -> int:
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.page_size * self.num_kv_heads * self.head_dim * elem

    def layer_shape(self, num_pages: int) -> tuple[int, int, int, int, int]:
        return (num_pages, 2, self.page_size, self.num_kv_heads, self.head_dim)


class DeviceKVCache:
    """The KV tensor of `num_pages` pages, zeroed; layer i reads and writes the view tensor[i]."""

    def __init__(self, layers: Sequence[KVLayer], layout: KVLayout, num_pages: int, device: torch.device) -> None:
        self.layout = layout
        self.num_pages = num_pages
        self.tensor = torch.zeros(
            (layout.num_layers, *layout.layer_shape(num_pages)), dtype=layout.dtype, device=device
        )
        for layer in layers:
            layer.kv_cache = self.tensor[layer.layer_idx]


@contextlib.contextmanager
def scratch_kv_cache(
    layers: Sequence[KVLayer], layout: KVLayout, num_pages: int, device: torch.device
) -> Iterator[torch.Tensor]:
    """Inside: every layer points at one scratch cache of `num_pages` pages (shared, values do not matter),
    for measuring a step before the real cache exists; after: the views the layers had are back."""
    scratch = torch.zeros(layout.layer_shape(num_pages), dtype=layout.dtype, device=device)
    saved = [layer.kv_cache for layer in layers]
    try:
        for layer in layers:
            layer.kv_cache = scratch
        yield scratch
    finally:
        for layer, kv in zip(layers, saved, strict=True):
            layer.kv_cache = kv
        del scratch
