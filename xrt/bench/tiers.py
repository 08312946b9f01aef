"""What the KV-tier scenarios (prefix, multiturn) share: engines with a given cache.tiers on a fresh L2 directory,
closing them, the tiers' stats as flat snapshots and their differences, the prompt tokens each tier served, and
the KV bytes per token of an engine's layout."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs

from xrt.bench.engine_timing import Engine, Output, Progress, greedy
from xrt.bench.latency import close_engine as close_engine  # the scenarios close their engines through here
from xrt.bench.latency import free_memory
from xrt.bench.setup import BenchError
from xrt.config import KVTiers, XrtConfig
from xrt.executor.device import resolve_device
from xrt.kvcache.connector import is_level
from xrt.kvstore.connector import TieredConnector

TIERS = ("gpu", "l1", "l2")
# The bench's L2 chunks go in a directory of their own under cache.l2.path (or bench.out_dir), made empty at the
# start and removed at the end: chunks of an earlier run (same seeded prompts) would turn a cold prefill into a hit.
L2_DIR = "bench-l2"


def bench_l2_root(cfg: XrtConfig) -> Path:
    base = Path(os.path.expanduser(cfg.cache.l2.path)) if cfg.cache.l2.path else Path(cfg.bench.out_dir)
    return base / L2_DIR


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    return path


def with_tiers(cfg: XrtConfig, tiers: KVTiers, l2_root: Path | None = None, **cache: Any) -> XrtConfig:
    """cfg with cache.tiers (and cache.l2.path, other cache fields) set, for one engine of a scenario."""
    l2 = attrs.evolve(cfg.cache.l2, path=str(l2_root)) if l2_root is not None else cfg.cache.l2
    return attrs.evolve(cfg, cache=attrs.evolve(cfg.cache, tiers=tiers, l2=l2, **cache))


def check_tiers_config(cfg: XrtConfig, tiers: Sequence[KVTiers]) -> None:
    """What XrtConfig.check would say of cfg with these cache.tiers (the scenario sets them itself); any
    parallel.tp (each rank keeps its own shard of the tiers, its own xrt/kvstore/agent.py)."""
    if any(t is not KVTiers.GPU for t in tiers):
        if not cfg.cache.prefix_caching:
            raise BenchError("cache.prefix_caching: the KV tiers store and find prefixes: must be true")


def build_tiered_engine(factory: Any, cfg: XrtConfig) -> Engine:
    """factory(cfg), a NIXL that is missing one line naming the field."""
    try:
        return factory(cfg)
    except RuntimeError as e:
        if type(e).__name__ == "NixlUnavailable":
            raise BenchError(f"cache.tiers={cfg.cache.tiers.value}: {e}") from e
        raise


def tier_manager(engine: Engine) -> TieredConnector | None:
    """The engine's KV tiers (its runner's connector); None for cache.tiers=gpu (or a stand-in engine)."""
    connector = getattr(getattr(engine, "runner", None), "connector", None)
    return connector if isinstance(connector, TieredConnector) else None


def evict_gpu_prefix(engine: Engine) -> None:
    """Forget the GPU prefix cache's keys: the next lookup of a prompt goes to the tiers."""
    engine.scheduler.kv.evict()  # type: ignore[attr-defined]


def release(cfg: XrtConfig) -> None:
    """After the last reference to an engine is gone: its KV cache, L1 buffer and graphs freed for the next."""
    free_memory(resolve_device(cfg))


def kv_bytes_per_token(engine: Engine) -> int:
    """Bytes of one token's K and V over every layer, from the engine's KV layout."""
    layout = engine.runner.kv_layout  # type: ignore[attr-defined]
    return layout.bytes_per_page // layout.page_size


# ---------------------------------------------------------------- stats


def stats_snapshot(engine: Engine) -> dict[str, float]:
    """The tiers' counters now, flat (TierStats.as_dict); {} for cache.tiers=gpu."""
    tiers = tier_manager(engine)
    if tiers is None:
        return {}
    return {k: v for k, v in tiers.stats.as_dict().items() if isinstance(v, (int, float))}


def stats_diff(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """What a phase added to each counter; a state (a high-water mark `*_max`, how L2 reads: stats.is_level) is
    its value after the phase."""
    return {k: v if is_level(k) else v - before.get(k, 0) for k, v in after.items()}


def served_by_tier(outs: Sequence[Output]) -> dict[str, int]:
    """Prompt tokens each tier served these requests (RequestOutput.cached_tokens; a tier it leaves out, as
    cache.tiers=gpu leaves out l1 and l2, served none)."""
    total = dict.fromkeys(TIERS, 0)
    for o in outs:
        got = getattr(o, "cached_tokens", None) or {}
        for t in TIERS:
            total[t] += int(got.get(t, 0))
    return total


# ---------------------------------------------------------------- requests


@dataclass
class StepTimes:
    """Where a run's wall time went, by engine.step() call: calls that prefilled (the engine's num_prefill_tokens
    grew) and the others (decode), each call's host wall time; decode_rows: tokens the decode calls generated.
    With overlapped decoding a call reads one step back while the next runs, so this splits time by what the
    engine was doing, not by kernel."""

    prefill_steps: int = 0
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_s: float = 0.0
    decode_rows: int = 0

    def step(self, engine: Engine) -> Sequence[Output]:
        prefilled = getattr(engine, "num_prefill_tokens", 0)
        generated = getattr(engine, "num_generated_tokens", 0)
        t0 = time.perf_counter()
        outs = engine.step()
        seconds = time.perf_counter() - t0
        if getattr(engine, "num_prefill_tokens", 0) > prefilled:
            self.prefill_steps += 1
            self.prefill_s += seconds
        else:
            self.decode_steps += 1
            self.decode_s += seconds
            self.decode_rows += getattr(engine, "num_generated_tokens", 0) - generated
        return outs

    def as_dict(self) -> dict[str, float]:
        d = dataclasses.asdict(self)
        d["decode_batch_mean"] = self.decode_rows / self.decode_steps if self.decode_steps else 0.0
        return d


def run_requests(engine: Engine, prompts: Sequence[list[int]], max_tokens: int,
                 steps: StepTimes | None = None) -> list[Output]:
    """Submit the prompts (greedy, ignore_eos), step until all finish; their outputs in prompt order. `steps`:
    where the time went (StepTimes), added to."""
    ids = [engine.add_request(p, greedy(max_tokens)) for p in prompts]
    done: dict[int, Output] = {}
    while engine.has_unfinished():
        for o in engine.step() if steps is None else steps.step(engine):
            done[o.request_id] = o
    outs = []
    for i in ids:
        o = done.get(i)
        if o is None or o.error or len(o.token_ids) != max_tokens:
            why = "unfinished" if o is None else f"{len(o.token_ids)} tokens ({o.finish_reason}: {o.error})"
            raise RuntimeError(f"request {i} ended with {why}, expected {max_tokens} tokens")
        outs.append(o)
    return outs


def ttft_ms(out: Output) -> float:
    ttft = getattr(out, "ttft_s", None)
    if ttft is None:
        raise RuntimeError(f"request {out.request_id} has no first-token time")
    return 1e3 * ttft


def tpot_ms(out: Output) -> float | None:
    times = getattr(out, "token_times_s", None) or []
    return 1e3 * (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def log_line(progress: Progress, text: str) -> None:
    progress(f"[bench] {text}")
