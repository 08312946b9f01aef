"""Rank 0's book of the requests in the reading state (the connector's `begin_read` / `poll_reads` /
`drop_read`): which read each request waits on, which reads are over and with how many chunks held by every rank,
and the plan parts that tell the other ranks (reads begun, dropped). The chunks themselves are held by each rank's
agent (agent.py, reads.py); a request's id() keys it (the book holds the request, so the id is not reused)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from xrt.kvcache.interface import KVSeq
from xrt.kvcache.plan import TierPlan
from xrt.kvstore.agent import TierAgent
from xrt.kvstore.peers import PlanSender
from xrt.kvstore.stats import TierStats

# how long an idle engine's poll waits for one of its reads to end before it looks again (a bound, not a cost: the
# poll returns as soon as a read ends)
IDLE_POLL_S = 0.005


@dataclass
class Read:
    """A request in the reading state: `first` is the chunk index its read starts at, `count` how many chunks;
    `held`: the leading chunks every rank holds once the read is over (None before)."""

    seq: KVSeq
    first: int
    count: int
    started: float
    held: int | None = None


class PlanParts:
    """The other ranks' plan under construction (TierPlan's fields, as lists), taken with each step."""

    def __init__(self) -> None:
        self.stores: list = []
        self.prefetches: list = []
        self.reads: list = []
        self.loads: list = []
        self.drops: list = []

    def take(self, polls: tuple[int, ...], flush: bool) -> TierPlan:
        plan = TierPlan(tuple(self.stores), tuple(self.prefetches), tuple(self.reads), tuple(self.loads),
                        tuple(self.drops), polls, flush)
        self.stores, self.prefetches, self.reads, self.loads, self.drops = [], [], [], [], []
        return plan


class Readings:
    def __init__(self, agent: TierAgent, stats: TierStats, plan: PlanParts, sender: PlanSender | None) -> None:
        self.agent, self.stats, self.plan, self.sender = agent, stats, plan, sender
        self._ids = itertools.count(1)
        self._reads: dict[int, Read] = {}  # read id -> its request, reading or over
        self._of: dict[int, int] = {}  # id(seq) -> read id

    def state(self, seq: KVSeq) -> bool | None:
        """None: seq has no read; True: it is reading; False: its read is over (admit it)."""
        read_id = self._of.get(id(seq))
        return None if read_id is None else self._reads[read_id].held is None

    def begin(self, seq: KVSeq, keys: list[bytes], first: int, deadline_s: float) -> None:
        read_id = next(self._ids)
        self.agent.begin_read(read_id, keys, deadline_s)
        if self.sender is not None:
            self.plan.reads.append((read_id, deadline_s, tuple(keys)))
        self._reads[read_id] = Read(seq, first, len(keys), time.perf_counter())
        self._of[id(seq)] = read_id
        self.stats.reads += 1

    def poll(self, idle: bool) -> list[KVSeq]:
        """The requests whose read is over (every rank's), in the order they began; idle: nothing else would run,
        so wait a little for one (with tensor parallelism, ask the ranks with a step of the plan alone)."""
        self.agent.reap()  # a read may wait for a gather of this rank's to be published
        if not self.in_flight():
            return []
        done = self._settle()
        if not done and idle:
            if any(self.agent.read_progress(r) < 0 for r in self.in_flight()):
                self.agent.reader.wait(IDLE_POLL_S)  # this rank's own reads: returns as one ends
            elif self.sender is not None:
                time.sleep(IDLE_POLL_S / 5)  # only another rank still reads: do not spin on the collective
            if self.sender is not None:
                self.sender.send_plan(self.plan.take(self.in_flight(), False))
            done = self._settle()
        return done

    def in_flight(self) -> tuple[int, ...]:
        """The reads not over yet (what the next step's plan polls)."""
        return tuple(r for r, read in self._reads.items() if read.held is None)

    def _settle(self) -> list[KVSeq]:
        done = []
        now = time.perf_counter()
        for read_id in self.in_flight():
            held = self.agent.read_progress(read_id) if self.sender is None else self.agent.agreed.pop(read_id, -1)
            if held >= 0:
                read = self._reads[read_id]
                read.held = held
                self.stats.read_wait_s += now - read.started
                done.append(read.seq)
        return done

    def take(self, seq: KVSeq) -> tuple[int, Read] | None:
        """seq is admitted: its read (over), forgotten here; None when it had none."""
        read_id = self._of.pop(id(seq), None)
        return None if read_id is None else (read_id, self._reads.pop(read_id))

    def drop(self, seq: KVSeq) -> None:
        """seq leaves without an admission (aborted, finished): what its read holds is released on every rank."""
        got = self.take(seq)
        if got is None:
            return
        self.agent.drop_read(got[0])
        if self.sender is not None:
            self.plan.drops.append(got[0])

    def __len__(self) -> int:
        return len(self._reads)
