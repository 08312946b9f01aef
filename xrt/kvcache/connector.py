"""The KV tiers' scheduler-side interface: what the page manager (manager.py) asks of whatever keeps KV below the
GPU pages, and the connector that does nothing (`NoTierConnector`, the default: cache.tiers=gpu).

The page manager is composed with one connector (never subclassed for it, the shape of vLLM v1's KV connector):
- `match` continues a GPU prefix hit into the tiers, with no side effects (the scheduler may match the same
  prompt several times before it admits it);
- `begin_read` is asked before an admission whether the request must first wait in the reading state while the
  tiers read its prefix (no disk I/O in the scheduler: the read runs on other threads, and on every rank);
  `poll_reads` hands back those whose read is over, `drop_read` forgets a request that leaves meanwhile;
- `on_alloc` is told when a sequence got its pages for a hit (the connector fills the pages past the GPU part and
  says how many tokens each tier supplied), `on_commit` when pages became full and computed (it may store them),
  `on_free` just before a sequence's pages go back to the pool (no copy into them may start after that);
- the step hooks (`step_started`, `step_launched`, `step_read_back`) let it time prefill steps and start stores
  once a step's tokens are read back, and `prefetch` lets it read ahead for a request left waiting;
- `take_plan` hands over what the other tensor-parallel ranks' tiers must do with the next step, as plain data
  that rides in the step (xrt/kvcache/plan.py; None at tp=1).
xrt/kvstore implements it (`xrt.kvstore.connector.TieredConnector`); the engine and the scheduler only ever see
this interface, so they hold no `if tiers`."""

from __future__ import annotations

from typing import Any, Protocol

from xrt.kvcache.interface import CommittedPages, KVSeq, PrefixHit
from xrt.kvcache.plan import TierPlan


class PagePins(Protocol):
    """What a connector may do to the page manager it is bound to (`TierConnector.bind`)."""

    def gpu_match(self, token_ids: list[int]) -> PrefixHit:
        """The GPU prefix cache's own hit, nothing from the tiers."""
        ...

    def pin(self, page_ids: list[int]) -> None:
        """Hold pages while a copy reads them: not handed out or evicted, even once freed."""
        ...

    def unpin(self, page_ids: list[int]) -> None: ...


def is_level(name: str) -> bool:
    """Whether a `TierCounters.as_dict` key is a state rather than a count (a high-water mark, how L2 reads): a
    phase's value is its value after the phase, not the difference (xrt/bench/tiers.py stats_diff); a gauge, not
    a counter, on /metrics."""
    return name.endswith("_max") or name == "l2_direct_io"


class TierCounters(Protocol):
    """What the tiers did, as `LLM.stats()` hands it back: a summary for `xrt run`, flat counts for bench rows
    (every key a count but those `is_level` names)."""

    def summary(self) -> str: ...

    def as_dict(self) -> dict[str, Any]: ...


class TierConnector(Protocol):
    def bind(self, pages: PagePins) -> None:
        """The page manager this connector serves (called once, by the manager)."""
        ...

    def match(self, token_ids: list[int], gpu: PrefixHit) -> PrefixHit:
        """`gpu` (the GPU prefix cache's hit), continued by what the tiers hold: a hit whose num_tokens reaches past
        its pages. Side-effect free."""
        ...

    def begin_read(self, seq: KVSeq, hit: PrefixHit) -> bool:
        """Whether seq (with `hit`, just matched) must wait in the reading state before its admission; starts its
        read. False once its read is over, or when it needs none."""
        ...

    def poll_reads(self, idle: bool) -> list[KVSeq]:
        """The requests whose read is over, to admit (in the order they began); idle: nothing else would run, so
        it may wait a little for one."""
        ...

    def drop_read(self, seq: KVSeq) -> None:
        """seq leaves without an admission (aborted, finished): what its read holds is released."""
        ...

    def take_plan(self) -> TierPlan | None:
        """The other ranks' share of what was decided since the last step, for the next step to carry."""
        ...

    def on_alloc(self, seq: KVSeq, hit: PrefixHit) -> None:
        """seq holds fresh pages past hit.pages: fill them from the tiers (its read's chunks, if it had one) and
        set num_computed_tokens / num_cached_tokens / cached_tokens to what was actually loaded."""
        ...

    def on_commit(self, event: CommittedPages) -> None: ...

    def on_free(self, seq: KVSeq) -> None: ...

    def prefetch(self, token_ids: list[int]) -> None:
        """A request the scheduler left waiting: read ahead what its admission will load."""
        ...

    def step_started(self, is_prefill: bool) -> None:
        """A forward pass is about to be launched."""
        ...

    def step_launched(self, is_prefill: bool, num_tokens: int) -> None:
        """The pass is queued on the device (it may still run)."""
        ...

    def step_read_back(self) -> None:
        """A step's tokens were read back: what it computed is in the pages."""
        ...

    def report(self, flush: bool = True) -> TierCounters | None:
        """The counters, every rank's L2 writer through its queue first (flush=False: as they stand, without
        waiting on the writer or the other ranks: what a metrics scrape reads); None without tiers."""
        ...

    def close(self) -> None:
        """Stop every thread, finish the L2 writer's queue (bounded), keep what was measured for the next process."""
        ...


class NoTierConnector:
    """No tiers: every hook is free, a match is the GPU hit."""

    def bind(self, pages: PagePins) -> None:
        pass

    def match(self, token_ids: list[int], gpu: PrefixHit) -> PrefixHit:
        return gpu

    def begin_read(self, seq: KVSeq, hit: PrefixHit) -> bool:
        return False

    def poll_reads(self, idle: bool) -> list[KVSeq]:
        return []

    def drop_read(self, seq: KVSeq) -> None:
        pass

    def take_plan(self) -> TierPlan | None:
        return None

    def on_alloc(self, seq: KVSeq, hit: PrefixHit) -> None:
        pass

    def on_commit(self, event: CommittedPages) -> None:
        pass

    def on_free(self, seq: KVSeq) -> None:
        pass

    def prefetch(self, token_ids: list[int]) -> None:
        pass

    def step_started(self, is_prefill: bool) -> None:
        pass

    def step_launched(self, is_prefill: bool, num_tokens: int) -> None:
        pass

    def step_read_back(self) -> None:
        pass

    def report(self, flush: bool = True) -> TierCounters | None:
        return None

    def close(self) -> None:
        pass
