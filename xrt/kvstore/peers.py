"""What rank 0's tier connector needs from the other tensor-parallel ranks (`parallel.tp` > 1): a way to send them a
step that carries a plan alone (xrt/kvcache/plan.py), when it must hear them while nothing else runs (a poll of
the reads in flight, a flush). Every other plan rides in the engine's own steps. Implemented by
`xrt.distributed.driver.TPRunner`; None at tp=1."""

from __future__ import annotations

from typing import Protocol

from xrt.kvcache.plan import TierPlan


class PlanSender(Protocol):
    @property
    def closed(self) -> bool:
        """The ranks are gone (they flushed their tiers as they shut down)."""
        ...

    def send_plan(self, plan: TierPlan) -> None:
        """Every rank applies the plan and joins its collectives; rank 0's agent holds what they agreed."""
        ...
