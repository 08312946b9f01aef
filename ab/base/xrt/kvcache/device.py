"""The KV cache on the device: one tensor [layers, pages, 2, page_size, kv_heads, head_dim] (index 0 of the
third axis K, 1 V: FlashInfer's NHD layout per layer), each attention layer bound to its own view of it.
How many pages it holds is decided by `xrt.kvcache.sizing`; which pages a sequence owns by the host side
(`xrt.kvcache.manager`).

`KVArrivals`: copies into the pages that another stream still runs (a KV tier loading a prefix, xrt/kvstore),
per layer, so the next forward pass waits for each layer's pages just before that layer reads them instead of
for the whole load before its first layer."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
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


# Layer groups of a tier's load: the first layer waits for 1/LAYER_GROUPS of the copy, and each group is one
# copy per page run of each chunk (6 groups x 32 chunks = 192 calls for an 8k-token prefix, ~3 us each).
LAYER_GROUPS = 6


def layer_groups(num_layers: int, groups: int = LAYER_GROUPS) -> list[tuple[int, int]]:
    """[first, end) layer ranges of about equal size, in order."""
    n = max(1, min(groups, num_layers))
    bounds = [round(g * num_layers / n) for g in range(n + 1)]
    return [(bounds[g], bounds[g + 1]) for g in range(n)]


class KVArrivals:
    """Copies into the pages that the next forward pass must wait for, per layer group: one CUDA event per
    group, made once and recorded again by every load (`record`), so a CUDA graph captured waiting on them
    (`graph_waits`: external events, whose waits a graph keeps as nodes) waits at replay for the latest load.
    Copies are recorded on one side stream in order, so a group's latest record covers every earlier copy
    into it. The runner `take`s what is pending before a forward pass: eager, each layer waits for its own
    group (ForwardContext.wait_kv); a graph captured with the waits replays them; any other waits for all.

    A load may also be `defer`red: its copies are queued by `take` itself, which the runner calls once the
    pass has queued its own uploads (inputs, attention plan). Copies queued before those hold them up on the
    copy engine, and the whole pass with them (H200, Qwen3-8B: a 3.7 GB load left the GPU idle ~75 ms before
    the prefill it fed, instead of overlapping all but its first layer group)."""

    def __init__(self, num_layers: int, device: torch.device, groups: int = LAYER_GROUPS) -> None:
        self.groups = layer_groups(num_layers, groups)
        self._layer_group = [g for g, (first, end) in enumerate(self.groups) for _ in range(first, end)]
        self.events: list[torch.cuda.Event] = []
        if device.type == "cuda":
            self.events = [torch.cuda.Event(external=True) for _ in self.groups]
            for event in self.events:  # created on its first record: a wait captured before that would be none
                event.record(torch.cuda.current_stream(device))
        self._pending: set[int] = set()
        self._deferred: list[Callable[[], None]] = []

    def defer(self, start: Callable[[], None]) -> None:
        """`start` queues copies (recording their groups) at the next `take`."""
        self._deferred.append(start)

    def pending(self) -> bool:
        """Whether the next forward pass has copies to wait for (queued or deferred)."""
        return bool(self._pending or self._deferred)

    def record(self, group: int, stream: torch.cuda.Stream) -> torch.cuda.Event:
        """The group's layers hold the copies queued on `stream` so far once the returned event completes."""
        event = self.events[group]
        event.record(stream)
        self._pending.add(group)
        return event

    def graph_waits(self) -> tuple[torch.cuda.Event, ...] | None:
        """Every layer's group event, for capturing a graph that waits on them; None on CPU (no events)."""
        return tuple(self.events[g] for g in self._layer_group) if self.events else None

    def take(self) -> tuple[torch.cuda.Event | None, ...] | None:
        """Queue the deferred loads; then each layer's event (None where nothing is pending), or None when nothing
        is (on CPU, where the copies are done when queued); cleared."""
        deferred, self._deferred = self._deferred, []
        for start in deferred:
            start()
        if not self._pending:
            return None
        ready = tuple(self.events[g] if g in self._pending else None for g in self._layer_group)
        self._pending.clear()
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
        self.arrivals = KVArrivals(layout.num_layers, torch.device(device))
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
