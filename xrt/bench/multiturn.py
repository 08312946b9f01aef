"""Multiturn scenario (`bench.scenario=multiturn`): throughput of conversations whose KV outgrows the GPU pages.

bench.clients conversations run side by side for bench.rounds rounds. In round r every client submits its
history (every earlier prompt and answer) plus bench.turn_len new seeded random tokens, all at once, greedy,
ignore_eos, bench.output_len tokens each; once all finish, each answer joins its client's history and the next
round starts. With cache.num_pages set small the histories do not all fit the GPU pages, so a round's prompts
find their prefixes in the tier below or recompute them. Each setting of bench.compare_tiers runs this on a fresh
engine (cache.tiers set, everything else from the config; L2 in bench-l2 under cache.l2.path or bench.out_dir,
empty at the start and removed after), after bench.warmup untimed requests of an unrelated prompt. Per setting:
requests/s and tokens/s over the wall time of all rounds, mean TTFT (add_request to first token, queueing in
the round included) and TPOT, the prompt tokens each tier served, the working set (clients x final history)
against the device's KV pages (GPU KV, CPU KV) and L1 + L2, in tokens and bytes, whether the outputs equal the
first setting's (greedy: they should; on a GPU a prefix recomputed in one prefill instead of attended from pages
may round differently), and the throughput ratio to the first setting. bench.iters does not apply: each setting
runs once."""

from __future__ import annotations

import copy
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from xrt.bench.engine_timing import Engine, Output, Progress
from xrt.bench.environment import adjusted, config_dict, environment, scenario_head
from xrt.bench.latency import build_engine, kv_pages
from xrt.bench.results import Record
from xrt.bench.setup import BenchError
from xrt.bench.tier_table import device_kv_name
from xrt.bench.tiers import (
    TIERS,
    StepTimes,
    bench_l2_root,
    build_tiered_engine,
    check_tiers_config,
    close_engine,
    fresh_dir,
    kv_bytes_per_token,
    log_line,
    release,
    run_requests,
    served_by_tier,
    stats_diff,
    stats_snapshot,
    tier_manager,
    tpot_ms,
    ttft_ms,
    with_tiers,
)
from xrt.bench.workload import WARMUP_REP
from xrt.config import KVTiers, XrtConfig
from xrt.executor.device import resolve_device
from xrt.units import GB, decimal_size

WARMUP_TOKENS = 8  # generated per warm-up request


def final_history(cfg: XrtConfig) -> int:
    """Tokens of one client's conversation after its last round."""
    b = cfg.bench
    return b.rounds * (b.turn_len + b.output_len)


def multiturn_config(cfg: XrtConfig) -> XrtConfig:
    """The scenario's copy of the config: a client's whole conversation fits max_model_len."""
    c = copy.deepcopy(cfg)
    b = c.bench
    if not b.compare_tiers:
        raise BenchError("bench.compare_tiers: must list at least one cache.tiers setting, got []")
    check_tiers_config(c, b.compare_tiers)
    need = final_history(c)
    if need > c.model.max_position_embeddings:
        raise BenchError(
            f"bench.rounds * (bench.turn_len + bench.output_len): must be <= "
            f"model.max_position_embeddings={c.model.max_position_embeddings}, got {need}"
        )
    c.model.max_model_len = max(c.model.max_model_len, need)
    return c


def turn(cfg: XrtConfig, client: int, rnd: int) -> list[int]:
    """Client's new tokens of round rnd: seeded, the same for every tier setting."""
    rng = np.random.default_rng([cfg.seed, client, rnd, cfg.bench.turn_len, 7])
    return rng.integers(0, cfg.model.vocab_size, size=cfg.bench.turn_len).tolist()


def run_multiturn(
    cfg: XrtConfig, progress: Progress, engine_factory: Callable[[XrtConfig], Engine] = build_engine
) -> list[Record]:
    given = config_dict(cfg)
    cfg = multiturn_config(cfg)
    b = cfg.bench
    device = resolve_device(cfg)
    root = bench_l2_root(cfg)
    base: dict[str, Any] = {
        **scenario_head("multiturn", cfg, device),
        "clients": b.clients,
        "rounds": b.rounds,
        "turn_len": b.turn_len,
        "output_len": b.output_len,
        "warmup": b.warmup,
        "tp": cfg.parallel.tp,
        "chunk_tokens": cfg.cache.chunk_tokens,
        "page_size": cfg.cache.page_size,
        **environment(device),
        "config": given,
    }
    records: list[Record] = []
    reference: dict[tuple[int, int], list[int]] | None = None
    try:
        for tiers in b.compare_tiers:
            used = with_tiers(cfg, tiers, fresh_dir(root) if tiers is KVTiers.L1_L2 else None)
            rec, outputs = _run_setting(used, tiers, engine_factory, progress)
            if reference is None:
                reference = outputs
            mismatched = sum(outputs.get(k) != v for k, v in reference.items())
            first = records[0]["requests_per_s"] if records else rec["requests_per_s"]
            rec.update(
                outputs_identical=mismatched == 0,
                mismatched_requests=mismatched,
                compared_with=b.compare_tiers[0].value,
                requests_per_s_ratio=rec["requests_per_s"] / first,
            )
            records.append({**base, **rec, "adjusted": adjusted(given, config_dict(used))})
            _summary_line(progress, records[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return records


def _run_setting(
    cfg: XrtConfig, tiers: KVTiers, factory: Callable[[XrtConfig], Engine], progress: Progress
) -> tuple[dict[str, Any], dict[tuple[int, int], list[int]]]:
    b = cfg.bench
    engine = build_tiered_engine(factory, cfg) if tiers is not KVTiers.GPU else factory(cfg)
    capacity = kv_pages(engine)
    longest = final_history(cfg)
    if capacity is not None and capacity[0] * capacity[1] < longest:
        close_engine(engine)
        raise BenchError(
            f"cache.num_pages: the KV cache holds {capacity[0] * capacity[1]} tokens, a client's last "
            f"round needs {longest} (bench.rounds * (bench.turn_len + bench.output_len))"
        )
    bytes_per_token = kv_bytes_per_token(engine)
    for w in range(b.warmup):
        rng = np.random.default_rng([cfg.seed, WARMUP_REP + w])
        run_requests(engine, [rng.integers(0, cfg.model.vocab_size, size=b.turn_len).tolist()], WARMUP_TOKENS)
    manager = tier_manager(engine)
    if manager is not None:
        manager.flush()
    histories: list[list[int]] = [[] for _ in range(b.clients)]
    outputs: dict[tuple[int, int], list[int]] = {}
    done: list[Output] = []
    prompt_tokens = output_tokens = 0
    round_s: list[float] = []
    steps = StepTimes()
    before = stats_snapshot(engine)
    start = time.perf_counter()
    for r in range(b.rounds):
        prompts = [h + turn(cfg, c, r) for c, h in enumerate(histories)]
        t0 = time.perf_counter()
        outs = run_requests(engine, prompts, b.output_len, steps)
        for c, (p, o) in enumerate(zip(prompts, outs, strict=True)):
            outputs[(c, r)] = list(o.token_ids)
            histories[c] = p + list(o.token_ids)
            prompt_tokens += len(p)
            output_tokens += len(o.token_ids)
        done += outs
        round_s.append(time.perf_counter() - t0)
        cached = sum(int(getattr(o, "num_cached_tokens", 0)) for o in outs)
        log_line(
            progress,
            f"multiturn {tiers.value}: round {r + 1}/{b.rounds}: {len(outs)} requests in "
            f"{round_s[-1]:.2f} s, {cached} of {sum(map(len, prompts))} prompt tokens "
            f"cached",
        )
    wall = time.perf_counter() - start
    if manager is not None:
        manager.flush()
    stats = stats_diff(stats_snapshot(engine), before)
    served = served_by_tier(done)
    num_pages, page_size = capacity if capacity is not None else (0, 0)
    close_engine(engine)
    del engine, manager
    release(cfg)

    chunk_bytes = bytes_per_token * cfg.cache.chunk_tokens
    l1 = int(cfg.cache.l1.size_gb * GB) // chunk_bytes * cfg.cache.chunk_tokens if tiers is not KVTiers.GPU else 0
    l2 = int(cfg.cache.l2.size_gb * GB) // chunk_bytes * cfg.cache.chunk_tokens if tiers is KVTiers.L1_L2 else 0
    ttfts = [ttft_ms(o) for o in done]
    tpots = [t for t in (tpot_ms(o) for o in done) if t is not None]
    requests = len(done)
    rec: dict[str, Any] = {
        "tiers": tiers.value,
        "requests": requests,
        "wall_s": wall,
        "round_s": round_s,
        "steps": steps.as_dict(),
        "requests_per_s": requests / wall,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "tokens_per_s": (prompt_tokens + output_tokens) / wall,
        "output_tokens_per_s": output_tokens / wall,
        "ttft_ms": statistics.fmean(ttfts),
        "tpot_ms": statistics.fmean(tpots) if tpots else None,
        "cached_tokens": served,
        "computed_prompt_tokens": prompt_tokens - sum(served.values()),
        "preemptions": sum(int(getattr(o, "num_preemptions", 0)) for o in done),
        "working_set_tokens": sum(map(len, histories)),
        "gpu_kv_tokens": num_pages * page_size,
        "l1_tokens": l1,
        "l2_tokens": l2,
        "kv_bytes_per_token": bytes_per_token,
        "tier_stats": stats,
    }
    log_line(
        progress,
        f"multiturn {tiers.value}: working set {tokens_and_size(rec['working_set_tokens'], bytes_per_token)}, "
        f"{device_kv(cfg)} {tokens_and_size(rec['gpu_kv_tokens'], bytes_per_token, f'{num_pages} pages, ')}, "
        f"L1 + L2 {tokens_and_size(l1 + l2, bytes_per_token)}; prompt tokens from "
        + ", ".join(f"{t} {served[t]}" for t in TIERS)
        + f", computed {rec['computed_prompt_tokens']}",
    )
    return rec, outputs


def device_kv(cfg: XrtConfig) -> str:
    """The KV pages of the device the model runs on, named for it: `GPU KV` on CUDA, `CPU KV` on CPU."""
    return device_kv_name(resolve_device(cfg).type)


def tokens_and_size(tokens: int, bytes_per_token: int, more: str = "") -> str:
    """`480 tokens (0.37 MB)`: a KV capacity in tokens and in bytes (`more` comes first in the brackets)."""
    return f"{tokens} tokens ({more}{decimal_size(tokens * bytes_per_token)})"


def _summary_line(progress: Progress, r: Record) -> None:
    same = "identical to" if r["outputs_identical"] else f"{r['mismatched_requests']} requests differ from"
    tpot = f"{r['tpot_ms']:.2f}" if r["tpot_ms"] is not None else "–"
    log_line(
        progress,
        f"multiturn {r['tiers']}: {r['requests_per_s']:.2f} requests/s "
        f"({r['requests_per_s_ratio']:.2f}x {r['compared_with']}), {r['tokens_per_s']:.0f} tokens/s, "
        f"TTFT {r['ttft_ms']:.1f} ms, TPOT {tpot} ms; outputs {same} {r['compared_with']}",
    )
