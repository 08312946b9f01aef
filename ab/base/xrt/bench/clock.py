"""Per-step timing. On CUDA an event is recorded after every step without synchronizing, so the
engine's own host/device overlap is kept; one synchronize at the end resolves all of them. Wall
time (perf_counter) is kept beside it to catch work the events cannot see (another stream)."""

from __future__ import annotations

import time
from itertools import pairwise

import torch


class StepClock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._events: list[torch.cuda.Event] = []
        self._walls: list[float] = []

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self._events, self._walls = [], []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events.append(ev)
        self._walls.append(time.perf_counter())

    def stop(self) -> None:
        """Close the interval of the last step and wait for the device."""
        if self.cuda:
            torch.cuda.synchronize()
        # The wall clock of the last step must include the device tail.
        self._walls[-1] = time.perf_counter()

    def wall_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in pairwise(self._walls)]

    def steps_ms(self) -> list[float]:
        """Duration of each step: device events on CUDA, wall time otherwise."""
        if not self.cuda:
            return self.wall_ms()
        return [a.elapsed_time(b) for a, b in pairwise(self._events)]
