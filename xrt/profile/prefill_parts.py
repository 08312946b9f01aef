"""The engine's prefill step as users run it, part by part: where a batch-1 TTFT goes between the step's start and
its token on the host. Host stamps (perf_counter) are taken around the engine's scheduling, the prefill graph's
staging, upload, attention plan and replay, and the token's read-back; on CUDA, events at the step's start, around
the replay and at the step's end split the device's time into idle-before-the-graph, the graph and the tail. The
stamps are wrappers set on the live objects for the timed steps only (instance attributes, removed after), so the
code timed is the code users run; an event costs a few microseconds of host time, counted in the part it ends.

A step that fits no prefill graph (eager executor, a cached prefix) shows no stage / upload / plan / replay parts:
its forward is inside "runner" as a whole."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from xrt.bench.markdown import md_table
from xrt.config import SamplingArgs
from xrt.engine.engine import LLMEngine
from xrt.executor.graphs import prefill as prefill_module

# Host stamps in the order a graph prefill passes them; a part is the time from the stamp before it to its own.
HOST_PARTS = (
    ("scheduled", "schedule (the engine's step up to the scheduler's answer)"),
    ("stage_start", "to the runner (KV step hooks, graph fit, the last upload's event)"),
    ("staged", "stage (token ids, positions, slots into the pinned block)"),
    ("uploaded", "upload (one host-to-device copy queued)"),
    ("planned", "attention plan (FlashInfer ragged prefill)"),
    ("replay_start", "to the replay"),
    ("replay_end", "graph launch (cudaGraphLaunch)"),
    ("executed", "after the replay (logits rows to float32)"),
    ("sampled", "read-back (sampling, the token to the host: waits for the device)"),
    ("end", "bookkeeping (append, stop checks, outputs)"),
)
EAGER = "runner, eager forward (no prefill graph fits the step)"
DEVICE_PARTS = (
    ("start", "replay_start", "device idle before the graph (host work, the upload)"),
    ("replay_start", "replay_end", "the graph's kernels"),
    ("replay_end", "end", "after the graph (cast, copy back, the host's bookkeeping)"),
    ("start", "end", "the step, start to end (the bench's TTFT)"),
)


class Stamps:
    """One step's host times and (on CUDA) events, by name."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.host: dict[str, float] = {}
        self.events: dict[str, torch.cuda.Event] = {}

    def mark(self, name: str, event: bool = False) -> None:
        if event and self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.events[name] = ev
        self.host[name] = time.perf_counter()


@contextmanager
def _wrapped(obj: Any, attr: str, before: Callable[[], None] | None,
             after: Callable[[], None] | None) -> Iterator[None]:
    """obj.attr calls before() and after() around itself while the context is open; put back after it."""
    own = attr in vars(obj)  # a module's function, an instance's attribute: set back; a method: the class's again
    original = getattr(obj, attr)

    def call(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before()
        out = original(*args, **kwargs)
        if after is not None:
            after()
        return out

    setattr(obj, attr, call)
    try:
        yield
    finally:
        if own:
            setattr(obj, attr, original)
        else:
            delattr(obj, attr)


class _StampedGraph:
    def __init__(self, graph: Any, stamps: Callable[[], Stamps]) -> None:
        self.graph = graph
        self.stamps = stamps

    def replay(self) -> None:
        s = self.stamps()
        s.mark("replay_start", event=True)
        self.graph.replay()
        s.mark("replay_end", event=True)


@contextmanager
def stamping(engine: LLMEngine, current: Callable[[], Stamps]) -> Iterator[None]:
    """Every part's stamp goes to current() while open."""

    def mark(name: str) -> Callable[[], None]:
        return lambda: current().mark(name)

    with ExitStack() as stack:
        stack.enter_context(_wrapped(engine.scheduler, "schedule", None, mark("scheduled")))
        stack.enter_context(_wrapped(engine.runner, "execute", None, mark("executed")))
        stack.enter_context(_wrapped(engine, "_sample", None, mark("sampled")))
        graphs = getattr(engine.runner, "prefill_graphs", None)
        if graphs is not None:
            stack.enter_context(_wrapped(prefill_module, "stage_prefill", mark("stage_start"), mark("staged")))
            stack.enter_context(_wrapped(graphs.flat, "upload", None, mark("uploaded")))
            stack.enter_context(_wrapped(graphs.parts.backend, "prepare_prefill_graph", None, mark("planned")))
            real = graphs.graphs
            graphs.graphs = {shape: _StampedGraph(g, current) for shape, g in real.items()}
            stack.callback(setattr, graphs, "graphs", real)
        yield


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_prefill_steps(engine: LLMEngine, batch: int, input_len: int, steps: int, rng: random.Random
                       ) -> list[Stamps]:
    """`steps` prefill steps of `batch` fresh random prompts, each stamped; every request is drained after its
    prefill (two tokens each), so each step starts from an idle engine as a batch-1 TTFT does."""
    device = engine.runner.device
    sampling = SamplingArgs(max_tokens=2, ignore_eos=True, temperature=0.0)
    out: list[Stamps] = []
    idle = Stamps(cuda=False)  # what the draining steps stamp: thrown away
    current = idle
    with stamping(engine, lambda: current):
        for _ in range(steps):
            for _ in range(batch):
                engine.add_request([rng.randrange(engine.vocab_size) for _ in range(input_len)], sampling)
            _sync(device)
            current = Stamps(device.type == "cuda")
            current.mark("start", event=True)
            engine.step()
            current.mark("end", event=True)
            out.append(current)
            current = idle
            _sync(device)
            while engine.has_unfinished():
                engine.step()
    return out


def _median_us(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e6:.1f}" if xs else "-"


def report(stamps: list[Stamps]) -> list[str]:
    """Markdown: the host's parts (median us over the steps that passed them) and, on CUDA, the device's."""
    spans: dict[str, list[float]] = {}
    for name, what in HOST_PARTS:
        if name == "executed":
            spans[EAGER] = []
        spans[what] = []
    for s in stamps:
        for i, (name, what) in enumerate(HOST_PARTS):
            if name in s.host:
                before = next((s.host[p] for p, _ in reversed(HOST_PARTS[:i]) if p in s.host), s.host["start"])
                eager = name == "executed" and "replay_end" not in s.host
                spans[EAGER if eager else what].append(s.host[name] - before)
    rows = [[what, _median_us(xs), str(len(xs))] for what, xs in spans.items() if xs]
    lines = [f"### engine prefill step, part by part, median of {len(stamps)} steps", "",
             *md_table(["host part", "us", "steps"], rows, [False, True, True])]
    if stamps and stamps[0].cuda:
        dev = []
        for a, b, what in DEVICE_PARTS:
            spans = [s.events[a].elapsed_time(s.events[b]) / 1e3 for s in stamps if a in s.events and b in s.events]
            dev.append([what, _median_us(spans), str(len(spans))])
        lines += ["", *md_table(["device (events)", "us", "steps"], dev, [False, True, True])]
    return lines
