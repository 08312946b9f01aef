"""A request body to the engine requests it asks for: its prompts tokenized and checked (the engine's `Admission`:
too long for model.max_model_len or the KV cache, bad token ids), its sampling built through the schema (so a bad
value is refused with the same words as `sampling.*` on the command line), one engine request per choice.
Everything wrong is an APIError(400) naming the request's field, raised before anything is queued."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import attrs

from xrt.config import SamplingArgs
from xrt.engine.admission import Admission
from xrt.engine.errors import RequestError
from xrt.engine.request import Request
from xrt.engine.validate_sampling import validate_sampling
from xrt.serve.errors import APIError
from xrt.serve.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields

SEED_MOD = 2**64


@dataclass(frozen=True)
class Prepared:
    """requests: one per choice, prompt-major: choice j of prompt i is requests[i * n + j] (its OpenAI index)."""

    requests: list[Request]
    n: int
    stream: bool
    include_usage: bool


class SamplingCache:
    """The server's `validate_sampling` over its defaults (`sampling.*`), remembered per distinct set of values a
    request gives: clients send the same few sets again and again, and each build through the schema is time in
    every TTFT. What it returns is shared by the requests that gave the same values (nothing changes a request's
    SamplingArgs: a choice's seed is a new one, attrs.evolve)."""

    SIZE = 1024  # distinct sets kept; past it the cache starts again

    def __init__(self, defaults: SamplingArgs) -> None:
        self.defaults = defaults
        self._built: dict[tuple[Any, ...], SamplingArgs] = {}

    def __call__(self, given: dict[str, Any]) -> SamplingArgs:
        """RequestError for values the schema refuses (never remembered)."""
        key = tuple((k, type(v), tuple(v) if isinstance(v, list) else v) for k, v in given.items())
        built = self._built.get(key)
        if built is None:
            built = validate_sampling(given, self.defaults)
            if len(self._built) >= self.SIZE:
                self._built.clear()
            self._built[key] = built
        return built


def prepare_completion(body: CompletionRequest, admission: Admission, samplings: SamplingCache) -> Prepared:
    unsupported(body)
    if body.echo:
        raise APIError(400, "echo: not supported", "echo")
    if body.suffix:
        raise APIError(400, "suffix: not supported", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, "best_of: not supported (only best_of = n)", "best_of")
    prompts = _prompt_list(body.prompt)
    sampling = _sampling(body, samplings, (body.max_tokens, "max_tokens"), (body.logprobs, "logprobs"))
    checked = [_check(admission, p, sampling, True, "prompt" if len(prompts) == 1 else f"prompt[{i}]")
               for i, p in enumerate(prompts)]
    return _prepared(body, checked)


def prepare_chat(body: ChatCompletionRequest, admission: Admission, samplings: SamplingCache) -> Prepared:
    unsupported(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs: needs logprobs=true", "top_logprobs")
    if body.tools:
        raise APIError(400, "tools: not supported", "tools")
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise APIError(400, "max_tokens: give max_completion_tokens or max_tokens, not both", "max_tokens")
    name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    top = (body.top_logprobs or 0) if body.logprobs else None
    sampling = _sampling(body, samplings, (limit, name), (top, "top_logprobs"))
    if admission.tokenizer is None:
        raise APIError(400, "messages: chat needs the checkpoint's tokenizer.json and chat template", "messages")
    messages = [_message(i, m.model_dump(exclude_none=True)) for i, m in enumerate(body.messages)]
    try:
        text = admission.tokenizer.apply_chat_template(messages)
    except ValueError as e:  # a message the template refuses (raise_exception), or a template that cannot render
        raise APIError(400, f"messages: {e}", "messages") from None
    # The template writes the special tokens itself, as LLM.chat does.
    return _prepared(body, [_check(admission, text, sampling, False, "messages")])


def unsupported(body: SamplingFields) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise APIError(400, f"{name}: not supported (only 0)", name)
    if body.logit_bias:
        raise APIError(400, "logit_bias: not supported", "logit_bias")


def _prepared(body: SamplingFields, checked: list[Request]) -> Prepared:
    requests = [_choice(r, j) for r in checked for j in range(body.n)]
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    return Prepared(requests, body.n, body.stream, include_usage)


def _choice(request: Request, j: int) -> Request:
    """Choice j of a prompt: with a seed, seed + j, so n sampled choices differ and each is reproducible."""
    seed = request.sampling.seed
    if j == 0 or seed is None:
        return request
    return Request(request.prompt_token_ids, attrs.evolve(request.sampling, seed=(seed + j) % SEED_MOD),
                   request.prompt)


def _prompt_list(prompt: object) -> list[Any]:
    if isinstance(prompt, str):
        return [prompt]
    assert isinstance(prompt, list)
    if not prompt:
        raise APIError(400, "prompt: is empty", "prompt")
    if isinstance(prompt[0], int):
        return [prompt]  # one prompt of token ids (the body's validation made every item an int)
    return list(prompt)


def _sampling(body: SamplingFields, samplings: SamplingCache, max_tokens: tuple[int | None, str],
              logprobs: tuple[int | None, str]) -> SamplingArgs:
    """The request's sampling over the server's defaults (`sampling.*`); None leaves a default alone, but for
    logprobs: a request that asks for none gets none, whatever `sampling.logprobs` says. max_tokens, logprobs: the
    value and the body's name for it (a problem names the field the client sent)."""
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    given = {"temperature": body.temperature, "top_p": body.top_p, "max_tokens": max_tokens[0], "seed": body.seed,
             "stop": stop, "ignore_eos": body.ignore_eos,
             "top_k": 0 if body.top_k == -1 else body.top_k}  # -1: vLLM's "all", 0 here
    try:
        return samplings({**{k: v for k, v in given.items() if v is not None}, "logprobs": logprobs[0]})
    except RequestError as e:
        name = e.field.removeprefix("sampling.").split("[")[0]
        name = {"max_tokens": max_tokens[1], "logprobs": logprobs[1]}.get(name, name)
        raise APIError(400, f"{name}: {e.message}", name) from None


def _message(i: int, message: dict[str, Any]) -> dict[str, Any]:
    """A message as the chat template takes it: content as text (text parts joined)."""
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"messages[{i}].content: only text parts are supported, got {part.get('type')!r}",
                               "messages")
            texts.append(part["text"])
        content = "".join(texts)
    return {**message, "content": content or ""}


def _check(admission: Admission, prompt: object, sampling: SamplingArgs, add_special: bool, where: str) -> Request:
    try:
        # A list here is token ids the body's model validated as JSON integers (protocol.CompletionRequest).
        return admission.check(prompt, sampling, add_special_tokens=add_special, where=where,
                               ints=isinstance(prompt, list))
    except RequestError as e:
        raise APIError(400, str(e), where.split("[")[0]) from None
