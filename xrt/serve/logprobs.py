"""The OpenAI shapes of the engine's logprobs (`TokenLogprob`, one per generated token): a completion choice's
`{tokens, token_logprobs, top_logprobs, text_offset}` and a chat choice's `{content: [{token, logprob, bytes,
top_logprobs}]}`. A token is named by the tokenizer's decode of it alone (special tokens included; U+FFFD for part
of a multi-byte character, whose own bytes the chat shape's `bytes` carries)."""

from __future__ import annotations

from typing import Any

from xrt.engine.logprobs import TokenLogprob
from xrt.engine.tokenizer import Tokenizer

# What JSON can carry for a logprob of -inf (a token the model rules out): vLLM's value.
_FLOOR = -9999.0


class LogprobShapes:
    """One HTTP request's: token texts decoded once each; `offsets` the text offset each completion choice's stream
    has reached, so the text_offset of its chunks continue each other (they sum the tokens' own texts, as a whole
    answer's do, so the streamed lists concatenated are the whole answer's)."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self.offsets: dict[int, int] = {}

    def text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            # Without a tokenizer (dummy weights, token-id prompts) a token is named by its id, as vLLM's
            # return_tokens_as_token_ids does.
            text = self.tokenizer.token_text(token_id) if self.tokenizer else f"token_id:{token_id}"
            self._texts[token_id] = text
        return text

    def _bytes(self, token_id: int) -> list[int]:
        return list(self.tokenizer.token_bytes(token_id) if self.tokenizer else self.text(token_id).encode())

    def completion(self, logprobs: list[TokenLogprob], index: int = 0) -> dict[str, Any]:
        """The legacy shape; top_logprobs holds the top k and the sampled token (OpenAI: up to logprobs + 1)."""
        tokens, values, tops, offsets = [], [], [], []
        offset = self.offsets.get(index, 0)
        for lp in logprobs:
            text = self.text(lp.token_id)
            tokens.append(text)
            values.append(_finite(lp.logprob))
            top = {self.text(t): _finite(v) for t, v in lp.top}
            top.setdefault(text, _finite(lp.logprob))
            tops.append(top)
            offsets.append(offset)
            offset += len(text)
        self.offsets[index] = offset
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def chat(self, logprobs: list[TokenLogprob]) -> dict[str, Any]:
        """The chat shape; top_logprobs holds exactly the top k the request asked for (top_logprobs)."""
        return {"content": [{**self._entry(lp.token_id, lp.logprob),
                             "top_logprobs": [self._entry(t, v) for t, v in lp.top]} for lp in logprobs]}

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": self.text(token_id), "logprob": _finite(logprob), "bytes": self._bytes(token_id)}


def _finite(value: float) -> float:
    return max(value, _FLOOR)
