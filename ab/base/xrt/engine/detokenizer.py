"""Incremental detokenisation: text grows token by token and never ends in a broken UTF-8 sequence."""

from __future__ import annotations

from collections.abc import Callable

# A few tokens of context before the unread ones: byte-level and metaspace decoders need the left
# neighbour to decide spacing and to join multi-byte characters split across tokens.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decodes `ids[prefix_offset:]` and emits what it adds beyond `ids[prefix_offset:read_offset]`.
    A delta ending in U+FFFD is held back until the next token completes the character."""

    def __init__(self, decode: Callable[[list[int]], str], num_prompt_tokens: int) -> None:
        self._decode = decode
        self.read_offset = num_prompt_tokens
        self.prefix_offset = max(num_prompt_tokens - _CONTEXT_TOKENS, 0)

    def step(self, ids: list[int]) -> str:
        prefix_text = self._decode(ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(ids[self.prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        delta = full_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(ids)
        return delta

    def flush(self, ids: list[int]) -> str:
        """Everything after the text emitted so far, a trailing incomplete character included
        (the sequence has ended, nothing will complete it)."""
        prefix_text = self._decode(ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(ids[self.prefix_offset :])
        if len(full_text) <= len(prefix_text):
            return ""
        self.prefix_offset = self.read_offset
        self.read_offset = len(ids)
        return full_text[len(prefix_text) :]
