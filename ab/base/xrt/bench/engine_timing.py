"""Time one batch through the LLMEngine, step by step, the way users run it. All sequences of a
latency batch are admitted together and advance in lockstep, so the last output_len - 1 steps are
the decode steps and everything before them is the prefill of the batch."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from xrt.bench.clock import StepClock
from xrt.config import SamplingArgs

Progress = Callable[[str], None]


class Output(Protocol):
    request_id: int
    token_ids: list[int]
    finish_reason: str
    error: str | None


class Engine(Protocol):
    """What the bench needs of xrt.engine.engine.LLMEngine."""

    def add_request(self, prompt: list[int], sampling: SamplingArgs) -> int: ...

    def step(self) -> Sequence[Output]: ...

    def has_unfinished(self) -> bool: ...


@attrs.define(frozen=True)
class RunTiming:
    ttft_ms: float
    tpot_ms: float | None
    ttft_wall_ms: float
    tpot_wall_ms: float | None
    prefill_steps: int


def split_steps(steps_ms: Sequence[float], wall_ms: Sequence[float], output_len: int) -> RunTiming:
    decode = output_len - 1
    prefill = len(steps_ms) - decode
    if prefill < 1:
        raise RuntimeError(f"expected at least {decode + 1} engine steps for {output_len} tokens, saw {len(steps_ms)}")
    return RunTiming(
        ttft_ms=sum(steps_ms[:prefill]),
        tpot_ms=statistics.fmean(steps_ms[prefill:]) if decode else None,
        ttft_wall_ms=sum(wall_ms[:prefill]),
        tpot_wall_ms=statistics.fmean(wall_ms[prefill:]) if decode else None,
        prefill_steps=prefill,
    )


def greedy(output_len: int) -> SamplingArgs:
    return SamplingArgs(temperature=0.0, max_tokens=output_len, ignore_eos=True)


def check_outputs(outs: Sequence[Output], expected: dict[int, int]) -> None:
    """expected: request id -> tokens it must have generated (ignore_eos, so exactly max_tokens)."""
    left = dict(expected)
    for o in outs:
        want = left.pop(o.request_id, None)
        if o.error or len(o.token_ids) != want:
            raise RuntimeError(
                f"request {o.request_id} ended with {len(o.token_ids)} tokens, expected {want} "
                f"({o.finish_reason}: {o.error})"
            )
    if left:
        raise RuntimeError(f"engine stopped with {len(left)} of {len(expected)} requests unfinished")


def submit(engine: Engine, prompts: Sequence[list[int]], output_lens: Sequence[int]) -> dict[int, int]:
    return {engine.add_request(p, greedy(n)): n for p, n in zip(prompts, output_lens, strict=True)}


def drive(engine: Engine, clock: StepClock) -> list[Output]:
    """Step the engine until it has nothing left, marking the clock after every step."""
    outs: list[Output] = []
    clock.start()
    while engine.has_unfinished():
        outs.extend(engine.step())
        clock.mark()
    clock.stop()
    return outs


def time_batch(engine: Engine, clock: StepClock, prompts: list[list[int]], output_len: int) -> RunTiming:
    expected = submit(engine, prompts, [output_len] * len(prompts))
    check_outputs(drive(engine, clock), expected)
    return split_steps(clock.steps_ms(), clock.wall_ms(), output_len)


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: list[RunTiming]) -> dict[str, Any]:
    return {
        "ttft_ms": _median([r.ttft_ms for r in runs]),
        "tpot_ms": _median([r.tpot_ms for r in runs]),
        "ttft_wall_ms": _median([r.ttft_wall_ms for r in runs]),
        "tpot_wall_ms": _median([r.tpot_wall_ms for r in runs]),
        "ttft_ms_all": [r.ttft_ms for r in runs],
        "tpot_ms_all": [r.tpot_ms for r in runs],
        "ttft_wall_ms_all": [r.ttft_wall_ms for r in runs],
        "tpot_wall_ms_all": [r.tpot_wall_ms for r in runs],
        "prefill_steps": max(r.prefill_steps for r in runs),
    }
