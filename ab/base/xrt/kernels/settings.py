"""The kernels' process-wide switches, set from the config by `xrt.executor.options.apply_options` before a
model is built. Apart from launch.py (and without triton), so the options can be applied on a machine
without triton; launch.py reads them as module attributes on every launch (no more per launch than the
constant it replaced)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# PDL only for launches of at most this many rows (decode batches): there it hides ~0.5 us of launch and
# ramp per kernel (H200 decode graph replay, 0.6B: 1118 -> 1003 us at batch 1, 1508 -> 1375 us at batch 8);
# at batch 100 the replay measured 4.65-4.71 ms with it on every launch, 4.45-4.48 ms without and with this
# limit (bench/results/h200-5b0c7b6, h200-4e548c7; a guess at the cause: early-launched programs holding SM
# slots the long attention and GEMM kernels could use), and a prefill's kernels are long enough that there is
# little to hide. -1: PDL off (executor.pdl=false). From executor.pdl_max_rows.
pdl_max_rows = 16


def set_pdl(enabled: bool, max_rows: int) -> None:
    """Programmatic dependent launch for launches of at most max_rows rows; off when not enabled."""
    global pdl_max_rows
    pdl_max_rows = max_rows if enabled else -1


@contextlib.contextmanager
def pdl_paused() -> Iterator[None]:
    """No PDL launches inside: for forward passes whose layers wait on events (a KV tier's load still copying).
    On the H200 a PDL launch right behind a stream's wait on an event not yet completed held the host until
    the event completed (qk_norm_rope_store_kv 597 us a call in an 8B step over a loading 8k prefix), so the
    host stopped launching ahead of the copies."""
    global pdl_max_rows
    saved, pdl_max_rows = pdl_max_rows, -1
    try:
        yield
    finally:
        pdl_max_rows = saved
