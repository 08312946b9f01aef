"""When loading a prefix from L2 pays: the measured cost of recomputing tokens (the engine's prefill rate)
against the measured cost of loading bytes (L2 read + verify bandwidth).

A tier must never make TTFT worse than a cold prefill. Reading Qwen3-8B's KV (~147 KB per token) from a
2 GB/s disk costs more than an H200 takes to recompute it, so the decision is made from measurements, not
assumed: `worth_loading` before a load starts (and before each batch of a long load, with the bandwidth the
batches so far achieved), and `deadline_s` bounds how long a request may wait in the reading state for the
chunks it reads (reads.py: a stalled or slow transfer is abandoned and its tokens prefilled). A new process
starts from what the last one on the same L2 directory measured (`restore`: prefill rate per device, L2
bandwidth, in measurements.json there) and from one small read of stored chunks at start-up (connector.py);
with nothing measured at all, loading is tried: the first batch measures the bandwidth, and a slow one ends the
load there.

Prefill steps are timed with CUDA events read once they complete (`PrefillClock`), never with a device sync
on the step path; on CPU a step's wall time is its cost."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch

# moving averages: the weight of a new measurement
NEW_WEIGHT = 0.3
# the slowest bandwidth assumed for an unmeasured L2, to bound the first batch's wait (bytes/s)
FLOOR_BYTES_PER_S = 100e6
# a batch may take this much longer than recomputing its tokens before it is abandoned (timer noise)
DEADLINE_SLACK = 1.25
MIN_DEADLINE_S = 0.05
# prefill steps whose rate the recompute estimate takes the fastest of
RECENT_PREFILLS = 32


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - NEW_WEIGHT) * old + NEW_WEIGHT * new


class PrefillClock:
    """Prefill steps' (tokens, seconds), without waiting for the device: `start` before the step, `stop` after
    it is launched, and `poll` hands back the steps whose end event has completed."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: deque[tuple[int, torch.cuda.Event, torch.cuda.Event]] = deque()
        self._t0 = 0.0
        self._e0: torch.cuda.Event | None = None
        self._done: list[tuple[int, float]] = []

    def start(self) -> None:
        if self.cuda:
            self._e0 = torch.cuda.Event(enable_timing=True)
            self._e0.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self, num_tokens: int) -> None:
        if not self.cuda:
            self._done.append((num_tokens, time.perf_counter() - self._t0))
            return
        assert self._e0 is not None
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((num_tokens, self._e0, end))
        self._e0 = None

    def poll(self) -> list[tuple[int, float]]:
        out, self._done = self._done, []
        while self._pending and self._pending[0][2].query():
            n, e0, e1 = self._pending.popleft()
            out.append((n, e0.elapsed_time(e1) / 1e3))
        return out


class LoadPolicy:
    """prefill_rate: tokens/s, the fastest of the recent prefill steps; l2_bandwidth: bytes/s of L2 loads
    (read and verified), a moving average. None until measured (tests and benchmarks may set them)."""

    def __init__(self) -> None:
        self.prefill_rate: float | None = None
        self.l2_bandwidth: float | None = None
        self._rates: deque[float] = deque(maxlen=RECENT_PREFILLS)

    def restore(self, saved: dict[str, Any], device: str) -> None:
        """Start from what an earlier process on this L2 directory measured (its prefill rate on this kind
        of device, its L2 bandwidth): a restarted server then weighs its first load correctly."""
        rate = saved.get("prefill_rate", {}).get(device) if isinstance(saved.get("prefill_rate"), dict) else None
        if isinstance(rate, (int, float)) and rate > 0:
            self.prefill_rate = float(rate)
            self._rates.append(float(rate))
        bw = saved.get("l2_bandwidth")
        if isinstance(bw, (int, float)) and bw > 0 and self.l2_bandwidth is None:
            self.l2_bandwidth = float(bw)

    def saved(self, previous: dict[str, Any], device: str) -> dict[str, Any]:
        """`previous` (another device's rates kept) with this process's measurements."""
        out = dict(previous)
        rates = dict(previous.get("prefill_rate", {})) if isinstance(previous.get("prefill_rate"), dict) else {}
        if self.prefill_rate:
            rates[device] = self.prefill_rate
        out["prefill_rate"] = rates
        if self.l2_bandwidth:
            out["l2_bandwidth"] = self.l2_bandwidth
        return out

    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        """The recompute rate is the fastest of the recent prefill steps, not their average: an estimate
        that is too slow would let a load run longer than recomputing (the first step of a new engine ran
        ~10x slower than the next on the H200, from one-time set-up), one that is too fast only recomputes
        what could have been loaded."""
        if num_tokens > 0 and seconds > 0:
            self._rates.append(num_tokens / seconds)
            self.prefill_rate = max(self._rates)

    def observe_l2(self, nbytes: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0:
            self.l2_bandwidth = _blend(self.l2_bandwidth, nbytes / seconds)

    def recompute_s(self, num_tokens: int) -> float | None:
        return num_tokens / self.prefill_rate if self.prefill_rate else None

    def load_s(self, nbytes: int) -> float | None:
        return nbytes / self.l2_bandwidth if self.l2_bandwidth else None

    def worth_loading(self, num_tokens: int, nbytes: int) -> bool:
        """False when loading these bytes is estimated slower than recomputing these tokens; True while
        either side is unmeasured (the load itself measures the bandwidth)."""
        load, recompute = self.load_s(nbytes), self.recompute_s(num_tokens)
        return load is None or recompute is None or load <= recompute

    def deadline_s(self, num_tokens: int, nbytes: int) -> float:
        """The longest a read of these tokens may take before it is abandoned: what recomputing its tokens costs
        (with some slack), or with no prefill measured yet, reading it at FLOOR_BYTES_PER_S."""
        recompute = self.recompute_s(num_tokens)
        limit = recompute * DEADLINE_SLACK if recompute is not None else nbytes / FLOOR_BYTES_PER_S
        return max(limit, MIN_DEADLINE_S)
