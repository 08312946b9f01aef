"""The per-step forward context: attention metadata and the backend, reached by layers through a
ContextVar so the model's forward signature stays (input_ids, positions). `kv_ready`: per layer the event
after which copies still running into that layer's KV pages are done (a KV tier's load,
xrt.kvcache.device.KVArrivals); each attention layer waits for its own just before it writes or reads the
cache, so the first layers compute while the later layers' KV is still arriving. Set for an eager step over a
load, and while capturing the decode graphs that wait for loads (the waits become nodes of the graph). `pdl`:
whether the layers may ask for programmatic dependent launch in this pass; off in those same passes, where a PDL
launch queued right behind a wait for a load's event would hold the host until the event completes (measured on
the H200: bench/NOTES.md), so the host would stop queueing ahead of the copies."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from xrt.attention.backend import AttentionBackend
from xrt.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class ForwardContext:
    meta: AttentionMetadata
    backend: AttentionBackend
    kv_ready: Sequence[torch.cuda.Event | None] | None = None
    pdl: bool = True

    def wait_kv(self, layer_idx: int) -> None:
        """Order this layer's attention after the copies into its KV pages (a no-op with none pending)."""
        if self.kv_ready is not None and (event := self.kv_ready[layer_idx]) is not None:
            torch.cuda.current_stream().wait_event(event)


_CTX: ContextVar[ForwardContext | None] = ContextVar("xrt_forward_context", default=None)


@contextlib.contextmanager
def forward_context(meta: AttentionMetadata, backend: AttentionBackend,
                    kv_ready: Sequence[torch.cuda.Event | None] | None = None,
                    pdl: bool = True) -> Iterator[ForwardContext]:
    ctx = ForwardContext(meta, backend, kv_ready, pdl)
    token = _CTX.set(ctx)
    try:
        yield ctx
    finally:
        _CTX.reset(token)


def get_forward_context() -> ForwardContext:
    ctx = _CTX.get()
    if ctx is None:
        raise RuntimeError("no forward context: the model must be called by an executor")
    return ctx


def in_prefill() -> bool:
    """Whether the forward pass running now is a prefill (`AttentionMetadata.is_prefill`); False outside one."""
    ctx = _CTX.get()
    return ctx is not None and ctx.meta.is_prefill


def pdl_allowed() -> bool:
    """Whether the forward pass running now lets its layers ask for PDL (ForwardContext.pdl); True outside one."""
    ctx = _CTX.get()
    return ctx is None or ctx.pdl
