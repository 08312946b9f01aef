"""The OpenAI response shapes: a whole completion / chat completion, the chunks of a streamed one, and usage. One
`Shapes` per HTTP request holds what every chunk repeats (id, created, model), whether it is chat, and the
logprobs' shapes (xrt/serve/logprobs.py: a choice's logprobs, whole or a chunk's tokens' share)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from xrt.engine.logprobs import TokenLogprob
from xrt.engine.outputs import RequestOutput
from xrt.engine.tokenizer import Tokenizer
from xrt.serve.logprobs import LogprobShapes
from xrt.serve.metrics import openai_finish_reason


def usage(outputs: list[RequestOutput], n: int) -> dict[str, Any]:
    """A prompt counts once whatever its `n` (OpenAI's rule); its cached tokens are its first choice's (the others
    were admitted beside it, before its pages were committed, or behind it, hitting them: not the prompt's own)."""
    firsts = outputs[::n]
    prompt = sum(len(o.prompt_token_ids) for o in firsts)
    completion = sum(len(o.token_ids) for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in firsts)}}


@dataclass
class Shapes:
    chat: bool
    model: str
    include_usage: bool = False
    tokenizer: Tokenizer | None = None  # names the tokens of logprobs
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    logprob_shapes: LogprobShapes = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.logprob_shapes = LogprobShapes(self.tokenizer)

    def _logprobs(self, index: int, logprobs: list[TokenLogprob] | None) -> dict[str, Any] | None:
        """A choice's logprobs (of the tokens given: a chunk's, or all of them); None when it asked for none."""
        if logprobs is None:
            return None
        shapes = self.logprob_shapes
        return shapes.chat(logprobs) if self.chat else shapes.completion(logprobs, index)

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, outputs: list[RequestOutput], n: int) -> dict[str, Any]:
        choices = []
        for i, o in enumerate(outputs):
            reason = openai_finish_reason(o.finish_reason)
            logprobs = self._logprobs(i, o.logprobs)
            if self.chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": o.text},
                                "logprobs": logprobs, "finish_reason": reason})
            else:
                choices.append({"index": i, "text": o.text, "logprobs": logprobs, "finish_reason": reason})
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": usage(outputs, n)}

    def chunk(self, index: int, text: str | None, finish_reason: str | None = None, role: bool = False,
              logprobs: list[TokenLogprob] | None = None) -> str:
        """One SSE event of one choice: text (None: no content key, the final chunk of a chat choice); role: the
        first chunk of a chat choice, which names the assistant role; logprobs: those of the tokens this chunk
        carries (a choice that asked for them has them on every chunk with tokens, its text held back or not)."""
        shaped = self._logprobs(index, logprobs)
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": shaped,
                                      "finish_reason": finish_reason}
            body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            body = {**self._head("text_completion"),
                    "choices": [{"index": index, "text": text or "", "logprobs": shaped,
                                 "finish_reason": finish_reason}]}
        if self.include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the last
        return event(body)

    def usage_chunk(self, outputs: list[RequestOutput], n: int) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return event({**self._head(obj), "choices": [], "usage": usage(outputs, n)})


def event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
