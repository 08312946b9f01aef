"""What a request hands back to the caller: `RequestOutput` once it has finished, `StreamOutput` after every step
that gave it something new (`LLMEngine.step_stream`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from xrt.engine.logprobs import TokenLogprob
from xrt.engine.sequence import Sequence


@dataclass(frozen=True)
class RequestOutput:
    """finish_reason, why the request ended:
    - "stop": an end-of-sequence token (unless ignore_eos) or a stop string;
    - "length": sampling.max_tokens tokens were generated;
    - "context_length": prompt + output reached model.max_model_len first (a max_tokens larger than the
      context left is accepted: generation stops here, and the engine logs a warning once);
    - "kv_cache": the request alone filled the whole KV cache, so its next token has no page (with
      other requests running it would have preempted them; raise cache.num_pages or cache.kv_size_gb);
    - "abort": `LLMEngine.abort` ended it (a server's client went away, or it was cancelled at shutdown).
    Requests that can never run (an empty prompt, no room under model.max_model_len, a prompt the KV cache
    cannot hold) are refused by `generate` / `add_request` with a RequestError instead.
    error: why, in words, when the engine had to end a request it could not serve; else None.
    ttft_s: seconds from add_request to the first generated token (None if none was generated).
    token_times_s: for each generated token, seconds from add_request until it was sampled.
    num_cached_tokens: prompt tokens whose KV was not computed for this request; cached_tokens: the same by
    the tier it came from, {"gpu": n} or with KV tiers {"gpu": n, "l1": n, "l2": n}.
    logprobs: with sampling.logprobs set, one TokenLogprob per token of token_ids (a stop string cuts the text, never
    the tokens: the token that completed it keeps its logprob); None when the request did not ask."""

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
    cached_tokens: dict[str, int] = field(default_factory=dict)
    num_preemptions: int = 0
    logprobs: list[TokenLogprob] | None = None

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
            cached_tokens=dict(seq.cached_tokens),
            num_preemptions=seq.num_preemptions,
            logprobs=list(seq.logprobs) if seq.sampling.logprobs is not None else None,
        )


@dataclass(frozen=True)
class StreamOutput:
    """What one step added to a request: the token ids generated since its last StreamOutput and the text they
    completed. A streamed request (`LLMEngine.queue(..., stream=True)`) gets one after every step that gave it a
    token; the text holds back what could still be the start of a stop string, or an incomplete UTF-8 character,
    so the concatenated texts are exactly the final text. A request not streamed gets one, when it finishes, with
    all of its tokens and text. `output` (the whole RequestOutput) is set on the last one, and only there.
    scheduled_at: perf_counter time the request was first scheduled (None while it waits).
    logprobs: aligned with token_ids when the request asks for them (sampling.logprobs), else None."""

    request_id: int
    token_ids: list[int]
    text: str
    output: RequestOutput | None = None
    scheduled_at: float | None = None
    logprobs: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.output is not None
