"""The OpenAI response shapes: a whole completion / chat completion, the chunks of a streamed one, and usage. One
`Shapes` per HTTP request holds what every chunk repeats (id, created, model) and whether it is chat."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from xrt.engine.outputs import RequestOutput
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
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, outputs: list[RequestOutput], n: int) -> dict[str, Any]:
        choices = []
        for i, o in enumerate(outputs):
            reason = openai_finish_reason(o.finish_reason)
            if self.chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": o.text}, "logprobs": None,
                                "finish_reason": reason})
            else:
                choices.append({"index": i, "text": o.text, "logprobs": None, "finish_reason": reason})
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": usage(outputs, n)}

    def chunk(self, index: int, text: str | None, finish_reason: str | None = None, role: bool = False) -> str:
        """One SSE event of one choice: text (None: no content key, the final chunk of a chat choice); role: the
        first chunk of a chat choice, which names the assistant role."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None,
                                      "finish_reason": finish_reason}
            body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            body = {**self._head("text_completion"),
                    "choices": [{"index": index, "text": text or "", "logprobs": None,
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
