"""Hydra and OmegaConf exceptions as one-line problems naming the override's key."""

from __future__ import annotations

import re

from xrt.reflect import Problem


def hydra_problems(e: BaseException, overrides: list[str]) -> list[Problem]:
    from hydra.errors import MissingConfigException

    if isinstance(e, MissingConfigException) and e.missing_cfg_file:
        group, _, option = str(e.missing_cfg_file).rpartition("/")
        options = ", ".join(e.options or [])
        if group:
            return [(group, f"no option {option!r} in group {group!r}; available: {options}")]
        return [("--config-name", f"no config {option!r}")]
    full_key = getattr(e, "full_key", None)
    if full_key:
        # OmegaConf appends "full_key: ...; object_type=..." lines; the first line is the message.
        return [(str(full_key), str(e).strip().splitlines()[0])]
    text = _one_line(str(e))
    return [(_key_in(text, overrides), text)]


def _key_in(text: str, overrides: list[str]) -> str:
    """The key of the override the message quotes, or '' when it names none."""
    for s in overrides:
        key = s.split("=", 1)[0].lstrip("+~")
        if f"'{s}'" in text or f"'{key}'" in text or f"'{s.lstrip('+~')}'" in text:
            return key
    for s in overrides:
        key = s.split("=", 1)[0].lstrip("+~")
        if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", text):
            return key
    m = re.search(r"'([A-Za-z_][\w.]*)'", text)
    return m.group(1) if m else ""


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return "; ".join(lines) if lines else "invalid override"
