"""What a finished request hands back to the caller."""

from __future__ import annotations

from dataclasses import dataclass, field

from xrt.engine.sequence import Sequence


@dataclass(frozen=True)
class RequestOutput:
    """finish_reason: "stop" (end-of-sequence token or stop string), "length" (max_tokens,
    model.max_model_len, or the whole KV cache) or "error" (see `error`).
    ttft_s: seconds from add_request to the first generated token (None if none was generated).
    token_times_s: for each generated token, seconds from add_request until it was sampled."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    error: str | None
    ttft_s: float | None
    token_times_s: list[float] = field(default_factory=list)
    prompt: str | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @classmethod
    def from_sequence(cls, seq: Sequence) -> RequestOutput:
        return cls(
            request_id=seq.request_id,
            prompt_token_ids=list(seq.prompt_token_ids),
            token_ids=seq.output_token_ids,
            text=seq.text,
            finish_reason=seq.finish_reason or "error",
            error=seq.error,
            ttft_s=seq.ttft_s,
            token_times_s=list(seq.token_times_s),
            prompt=seq.prompt,
            num_cached_tokens=seq.num_cached_tokens,
            num_preemptions=seq.num_preemptions,
        )
