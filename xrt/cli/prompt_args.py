"""The prompt as people type it: `xrt run "Hello, world"` (a positional argument) and `prompt=-` or `-`
(read from stdin). Both become one `prompt=` override quoted so it composes to exactly that text, also
under -m (a positional prompt never sweeps)."""

from __future__ import annotations

import re
import sys
from functools import cache

from xrt.reflect import ConfigError

# Commands that read `prompt` (config shows what run would use).
PROMPT_COMMANDS = ("run", "config")
# Hydra's override shapes: [+|++]key[@pkg]=value and ~key[@pkg][=value]. Anything else is a prompt.
_KEY = r"[A-Za-z_$][\w$\-]*(?:[./][\w$\-]+)*(?:@[\w$\-./:]*)?"
_OVERRIDE = re.compile(rf"(?:\+\+?)?{_KEY}=|~{_KEY}(?:=|$)", re.S)


class PromptArgError(ValueError):
    """A positional argument that cannot be the prompt; the CLI prints it as a usage error."""


def is_override(token: str) -> bool:
    return _OVERRIDE.match(token) is not None


@cache
def _field_names() -> frozenset[str]:
    from xrt.config import XrtConfig
    from xrt.reflect import walk

    return frozenset(f.path for f in walk(XrtConfig, groups=True))


def check_positional(token: str, earlier: str | None) -> str:
    """The positional prompt `token`, or a PromptArgError: a second one, or a bare field name (a forgotten
    `=value` would otherwise become the prompt and run)."""
    if earlier is not None:
        raise PromptArgError(f"one prompt expected, got {earlier!r} and {token!r}; quote it as one argument "
                             f"(\"Hello, world\")")
    if token in _field_names():
        raise PromptArgError(f"{token!r} is a field: write {token}=VALUE (or prompt={token} for that prompt)")
    return token


def prompt_overrides(overrides: list[str], positional: str | None) -> list[str]:
    """`overrides` with `prompt=-` read from stdin and the positional prompt appended, each quoted."""
    from xrt.config.verbatim import quote, split

    given = [o for o in overrides if (parts := split(o)) is not None and parts[1] == "prompt"]
    if positional is not None and given:
        raise PromptArgError(f"prompt given twice: {positional!r} and {given[0]}; drop one")
    out = []
    for o in overrides:
        parts = split(o)
        if parts is not None and parts[1] == "prompt" and parts[2] == "-":
            o = f"{parts[0]}prompt={quote(read_stdin())}"
        out.append(o)
    if positional is not None:
        out.append(f"prompt={quote(read_stdin() if positional == '-' else positional)}")
    return out


def read_stdin() -> str:
    """All of stdin with trailing newlines dropped (as the shell's $(...) does): `echo Hi | xrt run -`."""
    try:
        if sys.stdin is None:
            raise OSError("no stdin")
        text = sys.stdin.read()
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError([("prompt", f"cannot read the prompt from stdin (-): {e}")]) from e
    text = text.rstrip("\r\n")
    if not text:
        raise ConfigError([("prompt", "read from stdin (-), which was empty; pipe the prompt in or give prompt=TEXT")])
    return text


def strings_help() -> list[str]:
    """The rule of `xrt.config.verbatim` and `xrt.cli.paths`, as users meet it."""
    from xrt.config.verbatim import string_fields

    return [
        f"string fields ({', '.join(sorted(string_fields()))}) take the text as typed:",
        "  prompt=Hello, world  prompt=It's fine  prompt=3.10  literal: commas, quotes, ${...} and spaces kept",
        "  prompt='Hello, world'  one Hydra-quoted value follows Hydra: \\' is a quote, ${a.b} interpolates",
        "  -m prompt=a,b  with -m each comma separates choices (one job each), except in a quoted choice",
        "                 ('Hello, world',Bye) or written \\, ; range(), choice(), shuffle() sweep as in Hydra",
        "  run \"Hello, world\"  an argument that is not key=value is the prompt (run, config show)",
        "  run -  or  prompt=-  the prompt is read from stdin (trailing newlines dropped); a prompt starting",
        "                 with - (or one word naming a field) is written prompt=TEXT",
        "",
        "outputs: `output` is checked before a model loads (an existing, writable directory; not the",
        "  prompts_file; an existing file only with output_overwrite=true); run writes each result there as it",
        "  finishes (JSONL, completion order, flushed) and prints it; stream=true prints tokens as they arrive.",
        "  In a sweep, jobs sharing output=o.jsonl write o.0.jsonl, o.1.jsonl, ... (Hydra's job numbers, #0 first);",
        "  a bench sweep's jobs write <hydra.sweep.dir>/<job number>/results.jsonl, joined at its end (SWEEPS.md).",
    ]


__all__ = ["PROMPT_COMMANDS", "PromptArgError", "check_positional", "is_override", "prompt_overrides", "read_stdin",
           "strings_help"]
