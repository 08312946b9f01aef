"""One measurement of the kernels scenario, and how it is taken: every implementation is checked against the
reference on the same inputs before it is timed; one that is wrong, or fails to compile or run, is recorded
with its reason and the run moves on."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

# Bytes of distinct operands one timed call cycles through: in a decode step every weight and every KV page
# comes from HBM, so timing one small operand over and over (L2-resident, 60 MB on an H200) would flatter it.
COLD_BYTES = 256 << 20
# A kernel whose output is this far (max abs error / max abs reference) from the reference is reported wrong.
TOLERANCE = 2e-2

Launch = Callable[[], object]


@dataclass
class Measurement:
    """group: KernelGroup value; case: the kernel or layer; rows: tokens or batch; context: cached tokens per
    sequence (attention) or None; impl: what ran; role: baseline (the reference the others are compared to),
    default (what xrt runs) or candidate; us: median time of one call (None: not timed, see status and note);
    nbytes: bytes one call must move (for GB/s); timer: do_bench or do_bench_cudagraph."""

    group: str
    case: str
    rows: int
    context: int | None
    impl: str
    role: str
    us: float | None = None
    nbytes: int | None = None
    timer: str = "do_bench_cudagraph"
    status: str = "ok"
    note: str = ""

    def record(self) -> dict[str, Any]:
        rec = asdict(self)
        rec["gbps"] = self.nbytes / self.us / 1e3 if self.us and self.nbytes else None
        return rec


def time_us(fn: Launch, graph: bool = True, rep_ms: int = 10) -> float:
    """Median GPU time of fn() in microseconds. graph: replayed from a CUDA graph (launch overhead out, as in
    the CUDA-graph executor); otherwise launched from Python each time."""
    from triton import testing

    if graph:
        return testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e3
    return testing.do_bench(fn, rep=rep_ms, return_mode="median") * 1e3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return math.inf
    ref = ref.float()
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def error_note(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def measure(
    m: Measurement,
    run: Launch,
    timed: Launch | None = None,
    check: Callable[[], float] | None = None,
    graph: bool = True,
) -> Measurement:
    """Fill m.us by timing `timed` (default: run) after one call of run() and, when given, check() (the
    relative error of what run() wrote) under TOLERANCE. Errors become m.status / m.note."""
    m.timer = "do_bench_cudagraph" if graph else "do_bench"
    try:
        run()
        torch.cuda.synchronize()
        if check is not None:
            err = check()
            if not err < TOLERANCE:
                m.status, m.note = "wrong", f"rel err {err:.2e}"
                return m
        m.us = time_us(timed or run, graph)
    except Exception as e:  # a config the compiler rejects (shared memory, registers) is reported, not fatal
        m.status, m.note = "error", error_note(e)
    return m


def cold_copies(nbytes: int) -> int:
    """How many copies of an operand of nbytes a timed call cycles through to overflow L2 (at least 2)."""
    return max(2, math.ceil(COLD_BYTES / max(nbytes, 1)))
