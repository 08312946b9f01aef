"""The request bodies of /v1/completions and /v1/chat/completions, as pydantic models: a field of the wrong type
is a 400 naming it. Fields OpenAI defines that this server does not implement are refused when set to anything
but their no-op value (`prepare.unsupported`), never silently ignored; fields nobody defines (a client's own
extras) are ignored, as the OpenAI API does."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class SamplingFields(BaseModel):
    """What both endpoints take. None: the server's default (its `sampling.*` config)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # not OpenAI's: vLLM's extension (the openai client sends it through extra_body)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None  # vLLM's extension
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class CompletionRequest(SamplingFields):
    # Strict members tried in order: a 1024-id prompt validates more than ten times faster than in the default smart
    # union mode (each member's lax coercions tried for every id), and an id must be a JSON integer (not 1.0, "1"
    # or true).
    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]] = Field(union_mode="left_to_right")
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ...: passed to the chat template as given

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
