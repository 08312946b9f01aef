"""'did you mean ...' for misspelled names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, candidates: Iterable[str]) -> str | None:
    options = list(candidates)
    by_lower = {c.lower(): c for c in options}
    hits = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[hits[0]] if hits else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """'; did you mean X?' or '' when nothing is close."""
    hit = closest(name, candidates)
    return f"; did you mean {hit}?" if hit else ""
