"""What is derived from a sequence's token list (its pages' or its chunks' chained keys), kept by the list object,
so a prompt is keyed once on its way through lookups, the tiers' matches and commits, not once each time. Sound
because a sequence's token list only grows (xrt.engine.sequence: the prompt, then each sampled token appended),
what is derived covers a prefix of it, and an entry holds its list, so the list's id is not reused while the entry
lives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ByList(Generic[T]):
    """make(token_ids) for each list asked of, kept for the last `capacity` lists (the oldest dropped first)."""

    def __init__(self, make: Callable[[list[int]], T], capacity: int = 256) -> None:
        self.make = make
        self.capacity = capacity
        self._entries: dict[int, tuple[list[int], T]] = {}

    def get(self, token_ids: list[int]) -> T:
        entry = self._entries.get(id(token_ids))
        if entry is None or entry[0] is not token_ids:
            if len(self._entries) >= self.capacity:
                del self._entries[next(iter(self._entries))]
            entry = (token_ids, self.make(token_ids))
            self._entries[id(token_ids)] = entry
        return entry[1]

    def find(self, token_ids: list[int]) -> T | None:
        """The list's entry, None without one (none is made)."""
        entry = self._entries.get(id(token_ids))
        return entry[1] if entry is not None and entry[0] is token_ids else None

    def forget(self, token_ids: list[int]) -> None:
        """Drop the list's entry (its sequence let go of its pages)."""
        entry = self._entries.get(id(token_ids))
        if entry is not None and entry[0] is token_ids:
            del self._entries[id(token_ids)]

    def __len__(self) -> int:
        return len(self._entries)
