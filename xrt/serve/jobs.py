"""One HTTP request as the HTTP side follows it: a `Job` holds its choices (one engine request each) and the asyncio
queue their deltas arrive on; a `Choice` carries its key (what the engine's core knows it by) and the timestamps the
metrics need."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from xrt.engine.request import Request


@dataclass(eq=False)
class Choice:
    job: Job
    index: int
    request: Request
    arrival: float
    key: int
    last_token_at: float | None = None  # when its last token was handed on (Metrics.delivered)
    first_step_at: float | None = None  # when the step that made its first token ended (the engine's clock)
    queue_timed: bool = False


@dataclass(eq=False)
class Job:
    """One HTTP request's choices; `queue` gets (index, StreamOutput) or (index, EngineFailed)."""

    queue: asyncio.Queue[tuple[int, Any]]
    choices: list[Choice] = field(default_factory=list)
    unfinished: int = 0  # choices without their last delta (counted on the event loop's thread)
    aborted: bool = False
    stream: bool = False  # its chunks are timed as they are written (app._events), not as they reach the loop

    @property
    def done(self) -> bool:
        return self.unfinished == 0
