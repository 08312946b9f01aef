"""The checkpoint's tokenizer: `tokenizer.json` through `tokenizers`, end-of-sequence ids from
`generation_config.json` / `config.json`, and the chat template from the checkpoint rendered with jinja2."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jinja2
import tokenizers

from xrt.engine.detokenizer import IncrementalDetokenizer
from xrt.models.errors import CheckpointError

Message = dict[str, Any]


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _byte_level_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable bytes stand for themselves, the others (controls, space,
    0x7f-0xa0, 0xad) for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    rest = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(rest)}}


_BYTE_OF_CHAR = _byte_level_chars()


def _token_text(value: Any) -> str:
    # tokenizer_config.json stores special tokens as strings or as {"content": ...} objects.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _load(path: str) -> tokenizers.Tokenizer:
    """tokenizers' own errors quote a serde position that is not the problem for a JSON file of another kind
    (`{"a": 1}`: "expected `,` or `}` at line 1 column 5"): the JSON is read here first, so the message says what
    the file is."""
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: not a valid tokenizer.json ({why})")

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise bad(f"cannot read it: {e}") from None
    if not text.strip():
        raise bad("the file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad(f"not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        kind = f"an object with keys {', '.join(sorted(data)[:5])}" if isinstance(data, dict) else type(data).__name__
        raise bad(f'JSON, but {kind}: missing the "model" section every tokenizer.json has')
    try:
        return tokenizers.Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for malformed files
        raise bad(re.sub(r" at line \d+ column \d+$", "", _first_line(e))) from None


class Tokenizer:
    def __init__(self, checkpoint_dir: str) -> None:
        path = os.path.join(checkpoint_dir, "tokenizer.json")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: missing; the checkpoint needs a tokenizer.json")
        self.checkpoint_dir = checkpoint_dir
        self.path = path
        self._tok = _load(path)
        self.config = _read_json(os.path.join(checkpoint_dir, "tokenizer_config.json"))
        gen = _read_json(os.path.join(checkpoint_dir, "generation_config.json"))
        model = _read_json(os.path.join(checkpoint_dir, "config.json"))
        eos = _as_ids(gen.get("eos_token_id")) or _as_ids(model.get("eos_token_id"))
        if not eos:
            eos_text = _token_text(self.config.get("eos_token"))
            eos_id = self._tok.token_to_id(eos_text) if eos_text else None
            eos = [eos_id] if eos_id is not None else []
        self.eos_token_ids: list[int] = eos
        self._added = set(self._tok.get_added_tokens_decoder())

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token decoded alone, special tokens included (what a logprobs answer names it by); U+FFFD for a
        token that is part of a multi-byte character."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: with a byte-level decoder (GPT-2, Qwen) its vocabulary string mapped back
        to bytes, so a token holding part of a multi-byte character has its own bytes, which token_text cannot show;
        otherwise, and for added tokens, token_text's UTF-8."""
        piece = self._tok.id_to_token(token_id)
        if piece is None or type(self._tok.decoder).__name__ != "ByteLevel" or token_id in self._added:
            return self.token_text(token_id).encode()
        try:
            return bytes(_BYTE_OF_CHAR[c] for c in piece)
        except KeyError:  # not a byte-level piece after all
            return self.token_text(token_id).encode()

    def detokenizer(self, num_prompt_tokens: int) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.decode, num_prompt_tokens)

    def chat_template(self) -> str:
        return self._chat_template()[0]

    def _chat_template(self) -> tuple[str, str]:
        """(template, the file it comes from)."""
        path = os.path.join(self.checkpoint_dir, "chat_template.jinja")
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    return f.read(), path
            except UnicodeDecodeError as e:
                raise CheckpointError(f"{path}: not UTF-8 text ({e})") from None
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str) or not template:
            raise ValueError(
                f"{self.checkpoint_dir}: no chat template (expected tokenizer_config.json 'chat_template' "
                "or chat_template.jinja)"
            )
        return template, os.path.join(self.checkpoint_dir, "tokenizer_config.json")

    def check_chat_template(self) -> None:
        """Raise what apply_chat_template would for a template that cannot render (one user message)."""
        self.apply_chat_template([{"role": "user", "content": "check"}])

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        from xrt.engine.chat_template import render_chat_template

        special = {
            name: _token_text(self.config.get(name))
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        template, source = self._chat_template()
        try:
            return render_chat_template(
                template, messages, add_generation_prompt=add_generation_prompt, **special, **kwargs
            )
        except jinja2.TemplateError as e:  # a template that does not parse or fails while rendering
            line = f"line {e.lineno}: " if isinstance(e, jinja2.TemplateSyntaxError) else ""
            raise CheckpointError(f"{source}: invalid chat template ({line}{_first_line(e)})") from None


def checkpoint_tokenizer(checkpoint_dir: str | None, chat: bool) -> Tokenizer | None:
    """The checkpoint's tokenizer.json, if it has one (dummy weights have none); with `chat`, its chat template
    checked too."""
    if not checkpoint_dir or not os.path.exists(os.path.join(checkpoint_dir, "tokenizer.json")):
        return None
    tokenizer = Tokenizer(checkpoint_dir)
    if chat:
        tokenizer.check_chat_template()
    return tokenizer
