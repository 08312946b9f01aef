"""`executor.l2_prefetch` in the decode graphs: each layer asks the GPU's L2 for the weights it reads after its
attention (LayerOptions.prefetch_weights) as soon as its qkv projection is out, so that they stream from memory
while the attention, latency-bound at small batches, leaves it idle, and the projections after it read L2.

Two ways to place the request (`L2Prefetch`): `branch` forks a side stream after the qkv projection and runs
`xrt::prefetch_l2` there, so the captured graph gets a parallel node that waits for the projection and nothing
waits for it but the graph's end (`join`); `inline` launches it on the step's stream with PDL, between the
projection and the attention (xrt.kernels.prefetch: it lets the attention launch first and waits for the
projection last, so the chain stays ordered). Only the decode graphs of at most `max_rows` rows that wait for no
KV load take part; nothing else (eager steps, prefill graphs) asks for a prefetch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from xrt.config import ExecutorArgs, L2Prefetch


class L2WeightPrefetch:
    def __init__(self, mode: L2Prefetch, max_rows: int, device: torch.device) -> None:
        if mode is L2Prefetch.OFF:
            raise ValueError("L2WeightPrefetch: mode off asks for no prefetch (use None)")
        self.mode = mode
        self.max_rows = max_rows
        # On CPU (the tests' re-run "graphs") there is no stream to fork: the op, a no-op there, runs in line.
        self.side = torch.cuda.Stream(device) if mode is L2Prefetch.BRANCH and device.type == "cuda" else None
        self._forked = False

    @classmethod
    def of(cls, executor: ExecutorArgs, device: torch.device) -> L2WeightPrefetch | None:
        if executor.l2_prefetch is L2Prefetch.OFF or not executor.l2_prefetch_weights:
            return None
        return cls(executor.l2_prefetch, executor.l2_prefetch_max_rows, device)

    def applies(self, rows: int) -> bool:
        return rows <= self.max_rows

    def issue(self, weights: Sequence[torch.Tensor], pdl: bool) -> None:
        """Ask L2 for weights, after what the current stream has queued so far."""
        if self.side is None:
            torch.ops.xrt.prefetch_l2(list(weights), pdl)
            return
        main = torch.cuda.current_stream(self.side.device)
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            torch.ops.xrt.prefetch_l2(list(weights), False)
        self._forked = True

    def join(self) -> None:
        """The current stream waits for the side stream's requests (a graph's capture must end joined)."""
        if self._forked:
            assert self.side is not None
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
            self._forked = False
