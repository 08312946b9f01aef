"""A checked request, ready to queue: what `Admission.check` hands back and `LLMEngine.queue` takes."""

from __future__ import annotations

from dataclasses import dataclass

from xrt.config import SamplingArgs


@dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    sampling: SamplingArgs
    prompt: str | None  # the text, for text prompts
