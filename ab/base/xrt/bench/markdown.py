"""A markdown table from a header and rows of cells, for results.md and the profile command's reports."""

from __future__ import annotations

from collections.abc import Sequence


def md_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[bool] | None = None
) -> list[str]:
    """Lines of a GitHub markdown table; numeric[i]: right-align column i."""
    right = numeric or [False] * len(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("--:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines
