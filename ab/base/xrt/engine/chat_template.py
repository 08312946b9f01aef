"""Renders an HF chat template the way transformers does: a sandboxed jinja2 environment with
trim_blocks/lstrip_blocks, `raise_exception`, and a `tojson` that keeps non-ASCII text."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


def render_chat_template(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"messages[{i}]: expected an object with 'role' and 'content', got {m!r}")
    return _compile(template).render(messages=messages, **kwargs)
