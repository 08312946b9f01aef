"""One request's state as it moves through the engine: tokens, KV pages, progress, timing."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from xrt.config import SamplingArgs
from xrt.engine.detokenizer import IncrementalDetokenizer


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """token_ids holds the prompt followed by the generated tokens.

    num_cached_tokens: prompt tokens whose KV came from the prefix cache at the last admission.
    num_computed_tokens: tokens whose KV is in this sequence's pages; while decoding it is
        len(token_ids) - 1 (the newest sampled token is fed next step).
    page_hashes: chained hashes of the leading full, computed pages (the prefix-cache keys).
    in_prefill: admitted and still computing its prompt (or, after preemption, prompt + output).
    """

    request_id: int
    prompt_token_ids: list[int]
    sampling: SamplingArgs
    seed: int
    prompt: str | None = None
    detokenizer: IncrementalDetokenizer | None = None
    arrival_s: float = field(default_factory=time.perf_counter)
    token_ids: list[int] = field(init=False)
    status: SeqStatus = SeqStatus.WAITING
    page_table: list[int] = field(default_factory=list)
    page_hashes: list[bytes] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0
    in_prefill: bool = False
    num_preemptions: int = 0
    finish_reason: str | None = None
    error: str | None = None
    text: str = ""
    token_times_s: list[float] = field(default_factory=list)
    _generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    def generator(self, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed)
        return self._generator

    def append_token(self, token_id: int, now: float) -> str:
        """Adds a sampled token; returns the text it completes (may be empty)."""
        self.token_ids.append(token_id)
        self.token_times_s.append(now - self.arrival_s)
        if self.detokenizer is None:
            return ""
        delta = self.detokenizer.step(self.token_ids)
        self.text += delta
        return delta
