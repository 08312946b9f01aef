"""The per-step forward context: attention metadata and the backend, reached by layers through a
ContextVar so the model's forward signature stays (input_ids, positions)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from xrt.attention.backend import AttentionBackend
from xrt.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class ForwardContext:
    meta: AttentionMetadata
    backend: AttentionBackend


_CTX: ContextVar[ForwardContext | None] = ContextVar("xrt_forward_context", default=None)


@contextlib.contextmanager
def forward_context(meta: AttentionMetadata, backend: AttentionBackend) -> Iterator[ForwardContext]:
    ctx = ForwardContext(meta, backend)
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
