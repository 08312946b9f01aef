"""String fields take the user's text as typed. Hydra's grammar reads `prompt=Hello, world` as a sweep,
`prompt=3.10` as the float 3.1 and `prompt=It's fine` as a syntax error; the schema says these fields are
strings, so their overrides are rewritten here, before Hydra parses anything, into quoted strings that
compose to exactly the text given.

The rule (also in `xrt --help`):
- a string field's value is literal, character for character (commas, quotes, `!`, `${`, spaces);
- unless the whole value is one Hydra-quoted string ('...' or "..."): then Hydra's rules apply (escaped
  quotes, `${...}` interpolation), so `prompt='Hello, world'` still composes to Hello, world;
- with -m, commas separate choices (`prompt=a,b`: one job each), except inside a quoted choice
  (`prompt='Hello, world',Bye`) or written `\\,`; each choice is then literal, or Hydra-quoted, as above.

Everything here rewrites override strings only: `literal_overrides` for one run, `sweep_overrides` for Hydra's
multirun (its sweepers see each string choice as one quoted value)."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from xrt.reflect import Problem, walk

# `key=value`, `+key=value` or `++key=value` (Hydra's set, add, set-or-add); `~key` deletes and `@pkg` moves,
# so those are left to Hydra.
_ASSIGN = re.compile(r"(\+{0,2})([A-Za-z_][\w.\-]*)=(.*)", re.S)
_QUOTES = "'\""


@cache
def string_fields() -> frozenset[str]:
    """Dotted paths of the schema's `str` fields (prompt, output, model.path, bench.out_dir, ...)."""
    from xrt.config import XrtConfig

    return frozenset(f.path for f in walk(XrtConfig) if f.type is str)


@cache
def hydra_parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def split(override: str) -> tuple[str, str, str] | None:
    """(prefix, key, value) when `override` assigns a string field, else None."""
    m = _ASSIGN.fullmatch(override)
    if m is None or m.group(2) not in string_fields():
        return None
    return m.group(1), m.group(2), m.group(3)


def quote(text: str) -> str:
    """`text` as a single-quoted Hydra value that composes to exactly `text`."""
    # OmegaConf would resolve `${`: an odd run of backslashes before it makes it literal and keeps the
    # backslashes that were there (2k+1 -> k).
    t = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    # Hydra un-escapes only backslashes before a quote (or before the closing one): double those, escape quotes.
    t = re.sub(r"(\\*)('|\Z)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), t)
    return f"'{t}'"


def looks_quoted(value: str) -> bool:
    v = value.strip(" \t")
    return len(v) >= 2 and v[0] in _QUOTES and v[-1] == v[0]


def as_override(prefix: str, key: str, text: str) -> str:
    """An override that composes `key` to `text`; unquoted when it reads back literally (labels stay legible)."""
    return f"{prefix}{key}={quote(text) if looks_quoted(text) else text}"


def literal_overrides(overrides: list[str], problems: list[Problem]) -> list[str]:
    """Overrides for Hydra: each string field's literal value quoted; a Hydra-quoted value kept as written.
    A value that looks quoted but is not one Hydra string (`'It's fine'`) is reported, not guessed at."""
    out = []
    for s in overrides:
        parts = split(s)
        if parts is None:
            out.append(s)
            continue
        prefix, key, value = parts
        if not looks_quoted(value):
            out.append(f"{prefix}{key}={quote(value)}")
            continue
        problem = _quoted_problem(s, key, value)
        if problem is None:
            out.append(s)
        else:
            problems.append(problem)
    return out


def _quoted_problem(s: str, key: str, value: str) -> Problem | None:
    from hydra.errors import HydraException

    try:
        o = hydra_parser().parse_override(s)
    except HydraException:
        q = value.strip(" \t")[0]
        return key, (f"cannot parse the quoted value {value}: inside {q}...{q} write \\{q} for a {q}, "
                     f"or drop the outer quotes to take the text literally")
    # A quoted sweep (`'a','b'`) goes on to Hydra, whose sweep check says to add -m.
    return None if o.is_sweep_override() or isinstance(o.value(), str) else (key, f"cannot parse {value}")


def sweep_choices(override: str, problems: list[Problem]) -> list[str] | None:
    """With -m: one override per choice of this string-field override, or None when it is not a sweep (one
    literal job). Every comma outside a quoted choice (and not written `\\,`) separates choices, each taken
    literally (`prompt=3.10,Hi!` -> 3.10 and Hi!) or, when quoted, by Hydra's rules. Hydra's sweep functions
    (`range(1,4)`, `shuffle(a,b)`, `choice(a,b)`) keep their meaning."""
    parts = split(override)
    if parts is None:
        return None
    prefix, key, value = parts
    if _FUNCTION.match(value):
        from hydra.errors import HydraException

        try:
            o = hydra_parser().parse_override(override)
        except HydraException:
            o = None  # `f(x),g`: not one of Hydra's functions, so plain text
        if o is not None and o.is_sweep_override():
            if o.is_discrete_sweep():
                from omegaconf.errors import OmegaConfBaseException

                try:
                    return [f"{prefix}{key}={c}" for c in o.sweep_string_iterator()]
                except (HydraException, OmegaConfBaseException, ValueError) as e:
                    # Hydra parses some mixes it cannot expand (`range(1,3),x`: a range inside a choice).
                    problems.append((key, f"cannot expand the sweep {value} ({type(e).__name__})"))
                    return []
            problems.append((key, "only a,b,c / range() / glob() sweeps are supported"))
            return []
    pieces = _choices(value)
    if len(pieces) < 2:
        return None
    return [f"{prefix}{key}={p}" if looks_quoted(p) else as_override(prefix, key, p.replace("\\,", ","))
            for p in pieces]


def sweep_overrides(overrides: list[str], problems: list[Problem]) -> list[str]:
    """With -m: the overrides in Hydra's syntax for its sweepers. A string field's choices (`sweep_choices`)
    become one Hydra choice sweep of quoted values (`prompt=3.10,Hi!` -> `prompt='3.10','Hi!'`), so each job
    gets exactly the text given; a string field that does not sweep is quoted as `literal_overrides` does;
    every other override is left to Hydra as written."""
    out = []
    for s in overrides:
        choices = sweep_choices(s, problems)
        if choices is None:
            out.extend(literal_overrides([s], problems))
            continue
        quoted = literal_overrides(choices, problems)
        if quoted:
            head = quoted[0].split("=", 1)[0]
            out.append(f"{head}={','.join(q.split('=', 1)[1] for q in quoted)}")
    return out


_FUNCTION = re.compile(r"[ \t]*[A-Za-z_]\w*[ \t]*\(")


def _choices(value: str) -> list[str]:
    """`value` split at commas outside a quoted choice and not escaped (`\\,`), each piece trimmed."""
    pieces, start, i, at_start = [], 0, 0, True
    while i < len(value):
        c = value[i]
        if c == "\\":
            i += 2 if value[i + 1:i + 2] == "," else 1
        elif at_start and c in " \t":
            i += 1
        elif at_start and c in _QUOTES:
            i += 1
            while i < len(value) and value[i] != c:  # to the closing quote; \\' does not close it
                i += 2 if value[i] == "\\" else 1
            i += 1
        elif c == ",":
            pieces.append(value[start:i])
            start = i = i + 1
            at_start = True
            continue
        else:
            i += 1
        at_start = at_start and c in " \t"
    pieces.append(value[start:])
    return [p.strip(" \t") for p in pieces]


__all__ = [
    "as_override", "literal_overrides", "looks_quoted", "quote", "split", "string_fields", "sweep_choices",
    "sweep_overrides",
]
