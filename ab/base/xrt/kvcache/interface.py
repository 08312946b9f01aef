"""What the KV cache reads and writes on a sequence, and what it hands back: the prefix a lookup found
(`PrefixHit`) and the pages a commit made reusable (`CommittedPages`, the event a KV tier stores from).
The engine's `Sequence` satisfies `KVSeq`; the kvcache package never imports the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class KVSeq(Protocol):
    """The per-sequence fields the KV cache manager keeps (see `xrt.engine.sequence.Sequence`).

    page_table: the sequence's KV pages, in order. page_hashes: chained hashes of its leading full,
    computed pages (the prefix-cache keys). table_row: its row in the manager's `page_tables` array
    (-1: none). num_pending_tokens: tokens of decode steps launched but not read back yet; their pages
    are allotted already. cached_tokens: of num_cached_tokens, how many each tier supplied ("gpu", and with
    KV tiers "l1", "l2")."""

    token_ids: list[int]
    page_table: list[int]
    page_hashes: list[bytes]
    table_row: int
    num_cached_tokens: int
    cached_tokens: dict[str, int]
    num_computed_tokens: int
    num_pending_tokens: int


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """The longest cached prefix of a token list: `pages` hold its KV (one per full page, in order),
    `hashes` are their chained keys, `num_tokens` the tokens it covers. It always leaves at least the
    last token to compute (the sequence needs its logits). Valid until the cache next hands out a page:
    look up, check and allocate in one go."""

    pages: tuple[int, ...] = ()
    hashes: tuple[bytes, ...] = ()
    num_tokens: int = 0


NO_HIT = PrefixHit()


@dataclass(frozen=True, slots=True)
class CommittedPages:
    """Full pages of `seq` whose KV became computed and reusable, in order: `page_ids[i]` holds tokens
    `start + i * page_size ..` and is keyed by `hashes[i]`; together they cover tokens [start, end).
    A listener that keeps the pages' KV past this call (a copy to a lower tier) pins them first."""

    seq: KVSeq
    page_ids: list[int]
    hashes: list[bytes]
    start: int
    end: int

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start : self.end]


CommitListener = Callable[[CommittedPages], None]
