"""A step's KV tier plan: what the other tensor-parallel ranks' tiers do with this step, as plain data riding in the
step itself (`StepInput.tiers`, `DecodeBatch.tiers`), so it travels through the step channel in order with the
steps like everything else, and as flat int64 on the wire (`encode` / `decode`: no pickle).

Rank 0's tier connector decides everything and does its own share at once; the plan is the same decisions for every
other rank's tier agent, which applies it before the step's forward pass (stores first, then prefetches, reads,
loads, drops). Keys are rank 0's (each rank derives its own, xrt/kvstore/keys.py `rank_key`); chunks are whole
pages, so a chunk is its key and `pages_per_chunk` page ids.

- stores: (key, pages): gather these computed pages into L1 (and on to L2).
- prefetches: keys of a queued request's prefix: read those this rank's L2 holds into L1 in the background.
- reads: (read id, deadline, keys): hold these chunks in L1 for an admission, reading from L2 what L1 lacks, in
  the background, giving up at the deadline (seconds from the start; 0: none).
- loads: (read id, first, count, skip, pages): copy chunks first .. first + count - 1 of the read into `pages`
  (count x pages_per_chunk, in order) past the first `skip` pages (the GPU hit shares those) with this step's
  forward pass, then forget the read (its other chunks are released).
- drops: read ids to forget (the request was aborted, or admitted without them).
- polls: read ids in flight whose progress every rank reports at the end of the step, in one collective (MIN over
  the ranks): how many leading chunks each rank holds once its read is over, -1 while it is not.
- flush: every rank finishes its copies, prefetches and L2 writes, then the ranks' counters are summed (one
  collective, also the barrier).
A step with no sequences (`StepInput.seqs == []`) carries a plan alone: rank 0 sends one when it must hear the
ranks (a poll while nothing else runs, a flush)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KEY_BYTES = 32
KEY_INTS = KEY_BYTES // 8

Store = tuple[bytes, tuple[int, ...]]
Read = tuple[int, float, tuple[bytes, ...]]
Load = tuple[int, int, int, int, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class TierPlan:
    stores: tuple[Store, ...] = ()
    prefetches: tuple[tuple[bytes, ...], ...] = ()
    reads: tuple[Read, ...] = ()
    loads: tuple[Load, ...] = ()
    drops: tuple[int, ...] = ()
    polls: tuple[int, ...] = ()
    flush: bool = False

    def __bool__(self) -> bool:
        return bool(self.stores or self.prefetches or self.reads or self.loads or self.drops or self.polls
                    or self.flush)

    def encode(self) -> np.ndarray:
        """[n, store keys (4 n), store pages (n x ppc) with ppc first] [prefetches] [reads] [loads] [drops]
        [polls] [flush], each list led by its length (a read's and a load's fields inline)."""
        out: list[np.ndarray | list[int]] = []
        ppc = len(self.stores[0][1]) if self.stores else 0
        out.append([len(self.stores), ppc])
        out.append(_keys([k for k, _ in self.stores]))
        out.append(np.array([p for _, pages in self.stores for p in pages], dtype=np.int64))
        out.append([len(self.prefetches)])
        for keys in self.prefetches:
            out.append([len(keys)])
            out.append(_keys(keys))
        out.append([len(self.reads)])
        for read_id, deadline_s, keys in self.reads:
            out.append([read_id, max(1, round(deadline_s * 1e6)) if deadline_s else 0, len(keys)])
            out.append(_keys(keys))
        out.append([len(self.loads)])
        for read_id, first, count, skip, pages in self.loads:
            out.append([read_id, first, count, skip, len(pages), *pages])
        out.append([len(self.drops), *self.drops])
        out.append([len(self.polls), *self.polls])
        out.append([int(self.flush)])
        return np.concatenate([np.asarray(a, dtype=np.int64) for a in out])

    @staticmethod
    def decode(p: np.ndarray) -> TierPlan:
        r = _Reader(p)
        n, ppc = r.ints(2)
        keys = r.keys(n)
        pages = r.ints(n * ppc)
        stores = tuple((keys[i], tuple(pages[i * ppc : (i + 1) * ppc])) for i in range(n))
        prefetches = tuple(tuple(r.keys(r.int())) for _ in range(r.int()))
        reads = []
        for _ in range(r.int()):
            read_id, deadline_us, count = r.ints(3)
            reads.append((read_id, deadline_us / 1e6, tuple(r.keys(count))))
        loads = []
        for _ in range(r.int()):
            read_id, first, count, skip, num_pages = r.ints(5)
            loads.append((read_id, first, count, skip, tuple(r.ints(num_pages))))
        drops = tuple(r.ints(r.int()))
        polls = tuple(r.ints(r.int()))
        return TierPlan(stores, prefetches, tuple(reads), tuple(loads), drops, polls, bool(r.int()))


def _keys(keys: Sequence[bytes]) -> np.ndarray:
    if any(len(k) != KEY_BYTES for k in keys):
        raise ValueError(f"chunk keys are {KEY_BYTES} bytes")
    return np.frombuffer(b"".join(keys), dtype="<i8").astype(np.int64)


class _Reader:
    def __init__(self, p: np.ndarray) -> None:
        self.p, self.at = p, 0

    def int(self) -> int:
        self.at += 1
        return int(self.p[self.at - 1])

    def ints(self, n: int) -> list[int]:
        self.at += n
        return self.p[self.at - n : self.at].tolist()

    def keys(self, n: int) -> list[bytes]:
        raw = np.ascontiguousarray(self.p[self.at : self.at + KEY_INTS * n], dtype="<i8").tobytes()
        self.at += KEY_INTS * n
        return [raw[i * KEY_BYTES : (i + 1) * KEY_BYTES] for i in range(n)]
