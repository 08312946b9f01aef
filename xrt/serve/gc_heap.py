"""The start-up heap out of the garbage collector's way (`serve.freeze_gc`), as vLLM and SGLang freeze theirs.

CPython's full collection walks every object the collector tracks. A server's start-up leaves hundreds of thousands
of them (modules, the model's Python objects, the config, the kernels' compiled state) and serving frees none, yet a
full collection while serving walks them all: the HTTP process's event loop stops for it (every stream's next chunk
waits) or the engine's loop does (the next step waits). Frozen (`gc.freeze`), they sit in the permanent generation,
which no collection walks, so a full collection costs what serving itself allocated."""

from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collects what start-up left unreachable (frozen, it would never be), then freezes every tracked object; returns
    how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze_heap() -> None:
    """Hands the frozen objects back to the collector (a server stopping in a process that goes on)."""
    gc.unfreeze()
