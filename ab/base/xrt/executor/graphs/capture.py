"""How graphs are taken, as a part the graph managers are given: on CUDA real CUDA graphs from one shared
memory pool on one side stream; in the CPU tests a "graph" that runs its function again on replay (the
function reads only the static buffers, so a re-run computes what a replay of a captured graph would).
`capture_each` is the one warm-up-then-capture loop the decode and prefill graphs share."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from xrt.progress import Progress

K = TypeVar("K")
T = TypeVar("T")


class Graph(Protocol):
    def replay(self) -> None: ...


class CaptureStrategy(Protocol):
    def warm_up(self, fn: Callable[[], object]) -> None:
        """Run fn once outside any capture, where the captures will run (compiles kernels, makes lazy buffers)."""

    def capture(self, fn: Callable[[], T]) -> tuple[Graph, T]:
        """Capture fn(); returns the graph and fn's result (tensors every replay writes)."""
        ...

    def synchronize(self) -> None: ...

    def free_bytes(self) -> int:
        """Free device memory, for the capture log line."""
        ...


class CudaGraphCapture:
    """CUDA graphs on one side stream from one memory pool, shared by every graph this object captures
    (decode graphs largest first, then the prefill graphs: later, smaller graphs reuse the pool's blocks)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool: Any = torch.cuda.graph_pool_handle()

    def warm_up(self, fn: Callable[[], object]) -> None:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            fn()
        current.wait_stream(self.stream)

    def capture(self, fn: Callable[[], T]) -> tuple[Graph, T]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = fn()
        return graph, out

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def free_bytes(self) -> int:
        return torch.cuda.mem_get_info(self.device)[0]


class RerunGraph:
    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn

    def replay(self) -> None:
        with torch.inference_mode():
            self.fn()


class RerunCapture:
    """For CPU: capture returns a graph whose replay runs the function again."""

    def warm_up(self, fn: Callable[[], object]) -> None:
        fn()

    def capture(self, fn: Callable[[], T]) -> tuple[Graph, T]:
        return RerunGraph(fn), fn()

    def synchronize(self) -> None:
        pass

    def free_bytes(self) -> int:
        return 0


@dataclass
class Took:
    seconds: float = 0.0
    bytes: int = 0


@contextlib.contextmanager
def measured(strategy: CaptureStrategy) -> Iterator[Took]:
    """Time and device memory of what runs inside (set-up and captures), for the capture log line."""
    took = Took()
    strategy.synchronize()
    free_before = strategy.free_bytes()
    start = time.perf_counter()
    yield took
    strategy.synchronize()
    took.seconds = time.perf_counter() - start
    took.bytes = free_before - strategy.free_bytes()


def capture_each(
    strategy: CaptureStrategy,
    keys: list[K],
    prepare: Callable[[K], None],
    body: Callable[[K], T],
    desc: str,
) -> dict[K, tuple[Graph, T]]:
    """Warm every key up first (prepare, then body outside capture), so every Triton specialization is
    compiled, every attention module loaded and every lazy allocation (the capture stream's cuBLAS
    workspace) made before any capture begins; then prepare and capture each, in the order given."""
    out: dict[K, tuple[Graph, T]] = {}
    with torch.inference_mode():
        for key in keys:
            prepare(key)
            strategy.warm_up(lambda key=key: body(key))
        strategy.synchronize()
        # The caller logs the capture's summary: log lines only while a long capture runs, none at the end.
        with Progress(len(keys), desc, "graph", final=False) as bar:
            for key in keys:
                prepare(key)
                out[key] = strategy.capture(lambda key=key: body(key))
                bar.update()
    return out
