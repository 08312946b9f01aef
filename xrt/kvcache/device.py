"""The KV cache on the device: one tensor [layers, pages, 2, page_size, kv_heads, head_dim] (index 0 of the
third axis K, 1 V: FlashInfer's NHD layout per layer), each attention layer bound to its own view of it.
How many pages it holds is decided by `xrt.kvcache.sizing`; which pages a sequence owns by the host side
(`xrt.kvcache.manager`).

`KVArrivals`: copies into the pages that another stream still runs (a KV tier loading a prefix, xrt/kvstore),
per layer, so the next forward pass waits for each layer's pages just before that layer reads them instead of
for the whole load before its first layer."""

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


class KVArrivals:
    """Per layer, the event of the last copy into its pages that the next forward pass must wait for (None:
    nothing pending). Copies are recorded on one side stream in order, so the latest event of a layer covers
    every earlier copy into it. The writer calls `add`; the runner `take`s them all before a forward pass
    (eager: each layer waits for its own, ForwardContext.wait_kv; a replayed graph: for all of them first)."""

    def __init__(self, num_layers: int) -> None:
        self._ready: list[torch.cuda.Event | None] = [None] * num_layers
        self._pending = False

    def add(self, first_layer: int, end_layer: int, event: torch.cuda.Event) -> None:
        """Layers first_layer .. end_layer - 1 hold the copied pages once `event` completes."""
        for layer in range(first_layer, end_layer):
            self._ready[layer] = event
        self._pending = True

    @property
    def pending(self) -> bool:
        return self._pending

    def take(self) -> tuple[torch.cuda.Event | None, ...] | None:
        """Each layer's event (None where nothing is pending), or None when nothing is; cleared."""
        if not self._pending:
            return None
        ready = tuple(self._ready)
        self._ready = [None] * len(self._ready)
        self._pending = False
        return ready


def wait_all(ready: Sequence[torch.cuda.Event | None], stream: torch.cuda.Stream) -> None:
    """Make `stream` wait for every pending copy (each distinct event once)."""
    seen: set[int] = set()
    for event in ready:
        if event is not None and id(event) not in seen:
            seen.add(id(event))
            stream.wait_event(event)


class DeviceKVCache:
    """The KV tensor of `num_pages` pages, zeroed; layer i reads and writes the view tensor[i]."""

    def __init__(self, layers: Sequence[KVLayer], layout: KVLayout, num_pages: int, device: torch.device) -> None:
        self.layout = layout
        self.num_pages = num_pages
        self.arrivals = KVArrivals(layout.num_layers)
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
