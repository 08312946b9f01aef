"""Prompts as `LLM.generate` takes them: one prompt (text, or a list of token ids) or a list of prompts.
Each is checked for what it is (valid Unicode text; token ids that are ints in [0, vocab_size)) before
anything is queued, so a bad prompt raises RequestError naming it and leaves the engine as it was. Its
length against model.max_model_len and the KV cache is checked after tokenizing (`LLMEngine.check_request`)."""

from __future__ import annotations

import os
from numbers import Integral

from xrt.engine.errors import RequestError

Prompt = str | list[int]


def as_prompt_list(prompts: object) -> tuple[list[object], bool]:
    """(the prompts, whether one bare prompt was given). A list holding no text and no lists is one prompt
    of token ids (`[1, 2, 3]`), so `[1.5, 2]` is reported as a bad token id, not as two bad prompts."""
    if isinstance(prompts, str):
        return [prompts], True
    if not isinstance(prompts, (list, tuple)):
        raise RequestError(
            "prompts", f"expected text, a list of token ids or a list of prompts, got {type(prompts).__name__}"
        )
    if prompts and not any(isinstance(p, (str, list, tuple)) for p in prompts):
        return [list(prompts)], True
    return list(prompts), False


def check_prompt(prompt: object, where: str, vocab_size: int, index: int | None = None, ints: bool = False) -> Prompt:
    """The prompt as the engine takes it (token ids as a list of plain ints); RequestError naming `where`. ints: the
    caller knows token ids to be plain ints already (a request body validated as such): only their range is
    checked."""
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # lone surrogates: text no tokenizer (or file) can hold
            raise RequestError(where, _not_unicode(prompt, e.start), index) from None
        return prompt
    if not isinstance(prompt, (list, tuple)):
        raise RequestError(where, f"expected text or a list of token ids, got {type(prompt).__name__}", index)
    # bool is an int subclass and numpy integers are not ints: both by Integral, bool excluded.
    # set(map(type, ...)) runs in C: the common case (plain ints, in range) costs a few microseconds per thousand ids.
    if not prompt or (ints or set(map(type, prompt)) == {int}) and 0 <= min(prompt) and max(prompt) < vocab_size:
        return list(prompt)
    for pos, t in enumerate(prompt):
        if not isinstance(t, Integral) or isinstance(t, bool) or not 0 <= t < vocab_size:
            raise RequestError(
                where, f"token ids must be integers in [0, {vocab_size}), got {_show(t)} at position {pos}", index
            )
    return [int(t) for t in prompt]


def _not_unicode(text: str, at: int) -> str:
    code = ord(text[at])
    if 0xDC80 <= code <= 0xDCFF:
        # Python's surrogateescape: bytes that were not UTF-8 (a command-line argument, a file read with it).
        return f"not valid UTF-8: byte 0x{code - 0xDC00:02x} at character {at}"
    return f"not valid Unicode: lone surrogate {text[at]!r} at character {at}"


def no_tokenizer(checkpoint_dir: str | None) -> str:
    """Why a text prompt cannot be tokenized, and how to pass it as token ids instead."""
    how = ('pass token ids instead ({"prompt_token_ids": [1, 2, 3]} lines in a prompts_file; a list of ints in '
           "LLM.generate)")
    if not checkpoint_dir:
        return f"text prompts need a tokenizer, and model.load_format=dummy (random weights) has none; {how}"
    return f"text prompts need {os.path.join(checkpoint_dir, 'tokenizer.json')}, which is missing; {how}"


def _show(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"  # repr of a huge int is slow, or refused
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
