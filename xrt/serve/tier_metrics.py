"""The KV tiers' counters on /metrics (cache.tiers set): every key of `TierCounters.as_dict` as an `xrt:kv_tier_*`
series, from the snapshot the engine's core sends with its state (xrt.serve.core: never flushed, so a scrape never
waits on the L2 writer or the other ranks, whose counters are as of the last flush). A key ending in a tier's name
becomes a `tier` label (`hit_tokens_l1` -> `xrt:kv_tier_hit_tokens_total{tier="l1"}`), so one query sums or
splits tiers; seconds are `_seconds` as Prometheus names them; states (`is_level`) are gauges."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from xrt.kvcache.connector import is_level

TIER_SUFFIXES = ("_gpu", "_l1", "_l2")


def series(key: str) -> tuple[str, str | None]:
    """(metric name without `xrt:kv_tier_` and `_total`, tier label or None) of an as_dict key."""
    tier = next((s[1:] for s in TIER_SUFFIXES if key.endswith(s)), None)
    name = key[: -len(tier) - 1] if tier else key
    if name.endswith("_s"):
        name = name[:-2] + "_seconds"
    return name, tier


class TierCollector(Collector):
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.counters: dict[str, Any] | None = None  # TierCounters.as_dict(), once the engine reports tiers

    def collect(self) -> Iterator[Metric]:
        counters = self.counters
        if counters is None:
            return
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for key, value in counters.items():
            name, tier = series(key)
            family = families.get(name)
            if family is None:
                kind = GaugeMetricFamily if is_level(key) else CounterMetricFamily
                family = families[name] = kind(
                    f"xrt:kv_tier_{name}", f"KV tiers: {name.replace('_', ' ')} (xrt/kvstore/stats.py TierStats)",
                    labels=["model_name", "tier"] if tier else ["model_name"])
            family.add_metric([self.model_name, tier] if tier else [self.model_name], float(value))
        yield from families.values()
