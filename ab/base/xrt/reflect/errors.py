"""The one error every config problem becomes: a list of `(dotted.path, message)` pairs."""

from __future__ import annotations

from collections.abc import Iterable

Problem = tuple[str, str]


class ConfigError(ValueError):
    """All problems found in one config, each naming its dotted field. `str()` gives one line each."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        unique: list[Problem] = []
        for p in problems:
            if p not in unique:
                unique.append(p)
        self.problems = unique
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        return [f"{path}: {message}" if path else message for path, message in self.problems]


def join_path(prefix: str, name: str) -> str:
    if not prefix:
        return name
    if not name:
        return prefix
    return f"{prefix}{name}" if name.startswith("[") else f"{prefix}.{name}"
