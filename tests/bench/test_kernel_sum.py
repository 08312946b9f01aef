"""The breakdown's kernel table: each kernel's exposed time (the span it adds to the device's busy time) against
intervals worked out by hand, overlapping kernels (PDL) counted once in the exposed total."""

from __future__ import annotations

import torch
from torch.autograd.profiler_util import FunctionEvent

from xrt.profile.kernel_sum import kernel_table


class _Prof:
    def __init__(self, spans: list[tuple[str, float, float]]) -> None:
        cuda = torch.autograd.DeviceType.CUDA
        self._events = [FunctionEvent(id=i, name=n, thread=0, start_us=s, end_us=e, device_type=cuda)
                        for i, (n, s, e) in enumerate(spans)]
        # A host event is never a kernel.
        self._events.append(FunctionEvent(id=99, name="cpu_op", thread=0, start_us=0, end_us=1000))

    def events(self) -> list[FunctionEvent]:
        return list(reversed(self._events))  # the table orders by start itself


def _rows(lines: list[str]) -> dict[str, list[float]]:
    out = {}
    for line in lines[4:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[-1].strip("`")] = [float(c) for c in cells[:-1]]
    return out


def test_exposed_time_counts_overlap_once_and_gaps_against_the_next_kernel() -> None:
    # Two steps: gemv 0-10, attn starts early (PDL) at 8 and ends 15, a 2 us gap, norm 17-19, gemv waits from 18
    # to 30 (30 us exposed). Step 2 repeats it 100 us later: the 70 us gap before it is its first gemv's.
    step = [("gemv", 0, 10), ("attn", 8, 15), ("norm", 17, 19), ("gemv", 18, 30)]
    spans = step + [(n, s + 100, e + 100) for n, s, e in step]
    lines = kernel_table(_Prof(spans), steps=2, rows=10)
    assert lines[0] == "total 31.0 us per step, 65.0 us exposed, over 2 step(s)"
    rows = _rows(lines)
    # us/step, exposed us/step, calls/step, us/call
    assert rows["gemv"] == [22.0, (10.0 + 11.0 + 80.0 + 11.0) / 2, 2.0, 11.0]
    assert rows["attn"] == [7.0, 5.0, 1.0, 7.0]
    assert rows["norm"] == [2.0, 4.0, 1.0, 2.0]
    # Largest exposed first.
    assert list(rows) == ["gemv", "attn", "norm"]
