"""A checked request, ready to queue: what `Admission.check` hands back and `LLMEngine.queue` takes."""

from __future__ import annotations

from dataclasses import dataclass

from xrt.config import SamplingArgs
from xrt.ids import int64_bytes, int64_list


@dataclass(frozen=True)
class Request:
    prompt_token_ids: list[int]
    sampling: SamplingArgs
    prompt: str | None  # the text, for text prompts

    def __reduce__(self) -> tuple:
        # Pickled on the way to the engine's process (xrt serve): the ids as int64 bytes, which pickle as one
        # string instead of an opcode per int, so both ends of the pipe convert them about twice as fast.
        return _unpickle, (int64_bytes(self.prompt_token_ids), self.sampling, self.prompt)


def _unpickle(ids: bytes, sampling: SamplingArgs, prompt: str | None) -> Request:
    return Request(int64_list(ids), sampling, prompt)
