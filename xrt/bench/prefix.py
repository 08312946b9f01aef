"""Prefix scenario (`bench.scenario=prefix`): TTFT of one prompt by where its prefix's KV comes from.

Per length in bench.prefix_lens the prompt is that many seeded random tokens plus one (the token a prefix hit
still computes), so a hit covers the whole prefix when it is a multiple of cache.chunk_tokens. Each timed
iteration has a fresh prompt and measures, one request at a time (greedy, ignore_eos, OUTPUT_TOKENS tokens; TTFT
is RequestOutput.ttft_s, add_request to the first token on the host):
- cold: a plain engine (cache.tiers=gpu), the prompt prefilled (the reference every fraction is of);
- tiered_cold: an engine with cache.tiers=l1_l2, the same prefill with the tiers storing its chunks (their
  overhead); the L2 writer is then waited for (untimed);
- gpu: the same prompt again, from the GPU prefix cache;
- l1: the GPU prefix cache evicted (tiers.evict()), the prompt again: its chunks from L1;
- l2: that engine closed (L2 writer flushed and stopped), the L2 files dropped from the OS page cache
  (fsync + posix_fadvise DONTNEED, checked with mincore: `page_cache`), a new engine on the same directory, one
  untimed prefill of an unrelated prompt of the same length (the L2 policy, cache.l2.load_policy=measured, weighs
  loading against the prefill rate it measured), then the prompt: `l2_choice` loaded (every whole chunk from
  L2), partly loaded (cached_tokens["l2"] short of them: a load abandoned part way, or chunks the store dropped)
  or recomputed (none: the policy found loading slower, or the chunks were not there), and the L2 load bandwidth
  (bytes over seconds of the phase's L2 reads: at admission, loaded_bytes_l2 / load_s_l2, and by the
  prefetch thread, prefetch_bytes / prefetch_s).
One engine at a time: each is closed and freed before the next is built. The L2 directory is bench-l2 under
cache.l2.path (or bench.out_dir), emptied before each iteration and removed at the end; cache.l1.size_gb is
raised to hold one prompt of the longest length (KV bytes per token of the engine's layout x length x 1.2). The
same directory's sequential write and read bandwidth is probed first (xrt.bench.disk, bench.disk_probe_mb)."""

from __future__ import annotations

import copy
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from xrt.bench.disk import drop_directory, probe_disk
from xrt.bench.engine_timing import Engine, Output, Progress
from xrt.bench.environment import adjusted, config_dict, environment, scenario_head
from xrt.bench.latency import build_engine, kv_pages
from xrt.bench.results import Record
from xrt.bench.setup import BenchError
from xrt.bench.tier_table import outputs_cell
from xrt.bench.tiers import (
    TIERS,
    bench_l2_root,
    build_tiered_engine,
    check_tiers_config,
    close_engine,
    evict_gpu_prefix,
    fresh_dir,
    kv_bytes_per_token,
    log_line,
    release,
    run_requests,
    served_by_tier,
    stats_diff,
    stats_snapshot,
    tier_manager,
    ttft_ms,
    with_tiers,
)
from xrt.bench.workload import WARMUP_REP, random_prompts
from xrt.config import KVTiers, XrtConfig
from xrt.executor.device import resolve_device
from xrt.kvcache.connector import is_level
from xrt.units import GB

OUTPUT_TOKENS = 4  # generated per measured request: TTFT is the first, the rest compare the phases' outputs
# cache.l1.size_gb holds this many times one prompt's KV: the L2 writer's queue (half of L1's slots,
# writer.py) then holds all of one prompt's chunks, so the L2 phase finds the whole prefix stored
L1_HEADROOM = 2.2
PHASES = ("cold", "tiered_cold", "gpu", "l1", "l2")
RESTART_REP = WARMUP_REP + 1000  # the unrelated prompt a restarted engine prefills first


def prefix_config(cfg: XrtConfig) -> XrtConfig:
    """The scenario's copy of the config: every prompt prefills in one step and fits max_model_len."""
    c = copy.deepcopy(cfg)
    b = c.bench
    if not b.prefix_lens:
        raise BenchError("bench.prefix_lens: must list at least one prefix length, got []")
    check_tiers_config(c, [KVTiers.L1_L2])
    short = [n for n in b.prefix_lens if n < c.cache.chunk_tokens]
    if short:
        raise BenchError(
            f"bench.prefix_lens: each must hold at least one cache.chunk_tokens={c.cache.chunk_tokens} "
            f"chunk (the unit the tiers store), got {short[0]}"
        )
    need = max(b.prefix_lens) + 1 + OUTPUT_TOKENS
    if need > c.model.max_position_embeddings:
        raise BenchError(
            f"bench.prefix_lens: the longest prompt ({max(b.prefix_lens)} + 1 tokens) and its "
            f"{OUTPUT_TOKENS} generated must fit model.max_position_embeddings="
            f"{c.model.max_position_embeddings}, got {need}"
        )
    c.model.max_model_len = max(c.model.max_model_len, need)
    c.scheduler.max_batched_tokens = max(c.scheduler.max_batched_tokens, max(b.prefix_lens) + 1)
    return c


def l1_size_gb(cfg: XrtConfig, bytes_per_token: int) -> float:
    """cache.l1.size_gb, raised to hold one prompt of the longest length (and some)."""
    need = L1_HEADROOM * bytes_per_token * (max(cfg.bench.prefix_lens) + 1) / GB
    return max(cfg.cache.l1.size_gb, need)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class _Phases:
    """One length's measurements: per phase the outputs of every iteration and what each tier served."""

    def __init__(self) -> None:
        self.ttft: dict[str, list[float]] = {p: [] for p in PHASES}
        self.tokens: dict[str, list[list[int]]] = {p: [] for p in PHASES}
        self.cached: dict[str, list[dict[str, int]]] = {p: [] for p in PHASES}

    def add(self, phase: str, out: Output) -> dict[str, int]:
        self.ttft[phase].append(ttft_ms(out))
        self.tokens[phase].append(list(out.token_ids))
        served = served_by_tier([out])
        self.cached[phase].append(served)
        return served


def run_prefix(
    cfg: XrtConfig, progress: Progress, engine_factory: Callable[[XrtConfig], Engine] = build_engine
) -> list[Record]:
    given = config_dict(cfg)
    cfg = prefix_config(cfg)
    device = resolve_device(cfg)
    root = fresh_dir(bench_l2_root(cfg))
    try:
        disk: dict[str, Any] = {}
        if cfg.bench.disk_probe_mb:
            disk = probe_disk(root, cfg.bench.disk_probe_mb)
            log_line(
                progress,
                f"prefix: {root} sequential write {disk['disk_write_gbps']:.2f} GB/s "
                f"({disk['disk_write_mode']}), read {disk['disk_read_gbps']:.2f} GB/s "
                f"({disk['disk_read_mode']}), {disk['disk_probe_bytes'] / 1e6:.0f} MB",
            )
        base: dict[str, Any] = {
            **scenario_head("prefix", cfg, device),
            "chunk_tokens": cfg.cache.chunk_tokens,
            "l2_load_policy": cfg.cache.l2.load_policy.value,
            "page_size": cfg.cache.page_size,
            "output_tokens": OUTPUT_TOKENS,
            "warmup": cfg.bench.warmup,
            "iters": cfg.bench.iters,
            "tp": cfg.parallel.tp,
            "l2_path": str(root),
            **disk,
            **environment(device),
            "config": given,
        }
        records = []
        for n in cfg.bench.prefix_lens:
            used, rec = _measure_length(cfg, n, root, engine_factory, progress)
            bw, read = rec["l2_load_gbps"], disk.get("disk_read_gbps")
            records.append(
                {
                    **base,
                    **rec,
                    "l2_load_frac": bw / read if bw and read else None,
                    "adjusted": adjusted(given, config_dict(used)),
                }
            )
            _summary_line(progress, records[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return records


def _measure_length(
    cfg: XrtConfig, n: int, root: Path, factory: Callable[[XrtConfig], Engine], progress: Progress
) -> tuple[XrtConfig, dict[str, Any]]:
    """(the tiered engines' config, the row's figures) of prefix length n."""
    b = cfg.bench
    vocab, seed, length = cfg.model.vocab_size, cfg.seed, n + 1
    prompts = [random_prompts(vocab, 1, length, seed, i)[0] for i in range(b.iters)]
    warm = [random_prompts(vocab, 1, length, seed, WARMUP_REP + w)[0] for w in range(b.warmup)]
    restart_warm = random_prompts(vocab, 1, length, seed, RESTART_REP)[0]
    got = _Phases()
    whole = n // cfg.cache.chunk_tokens * cfg.cache.chunk_tokens  # the prompt's whole chunks: what a tier can hold

    def step(phase: str, engine: Engine, prompt: list[int], i: int) -> dict[str, int]:
        (out,) = run_requests(engine, [prompt], OUTPUT_TOKENS)
        served = got.add(phase, out)
        hits = ", ".join(f"{t} {served[t]}" for t in TIERS if served[t])
        log_line(
            progress,
            f"prefix {n}: iteration {i + 1}/{b.iters} {phase}: TTFT {got.ttft[phase][-1]:.2f} ms "
            f"(prefix tokens from {hits or 'none'})",
        )
        return served

    # cold: a plain engine
    plain_cfg = with_tiers(cfg, KVTiers.GPU)
    engine = factory(plain_cfg)
    bytes_per_token = kv_bytes_per_token(engine)
    capacity = kv_pages(engine)
    if capacity is not None and capacity[0] * capacity[1] < length + OUTPUT_TOKENS:
        raise BenchError(
            f"cache.num_pages: the KV cache holds {capacity[0] * capacity[1]} tokens, a prompt of "
            f"bench.prefix_lens={n} needs {length + OUTPUT_TOKENS}"
        )
    for w in warm:
        run_requests(engine, [w], OUTPUT_TOKENS)
    for i, p in enumerate(prompts):
        step("cold", engine, p, i)
    del engine
    release(cfg)

    l1 = attrs.evolve(cfg.cache.l1, size_gb=l1_size_gb(cfg, bytes_per_token))
    tiered_cfg = with_tiers(cfg, KVTiers.L1_L2, root, l1=l1)
    runs: list[dict[str, Any]] = []
    store_stats: dict[str, float] = {}
    restart_stats: dict[str, float] = {}
    for i, p in enumerate(prompts):
        fresh_dir(root)
        engine = build_tiered_engine(factory, tiered_cfg)
        tiers = tier_manager(engine)
        for w in warm:
            run_requests(engine, [w], OUTPUT_TOKENS)
        if tiers is not None:
            tiers.flush()
        start = stats_snapshot(engine)
        step("tiered_cold", engine, p, i)
        if tiers is not None:
            tiers.flush()  # the L2 writer done before the next phases are timed
        step("gpu", engine, p, i)
        if tiers is not None:
            evict_gpu_prefix(engine)  # forget the GPU prefix cache: the next lookup goes to L1
        step("l1", engine, p, i)
        close_engine(engine)
        _add(store_stats, stats_diff(stats_snapshot(engine), start))
        del engine, tiers
        release(cfg)

        drop = drop_directory(root)
        log_line(
            progress,
            f"prefix {n}: iteration {i + 1}/{b.iters}: restart; L2 files {drop['files']}, page cache "
            f"{drop['status']}" + (f" ({drop['resident']:.0%} resident)" if drop.get("resident") else ""),
        )
        engine = build_tiered_engine(factory, tiered_cfg)
        tiers = tier_manager(engine)
        run_requests(engine, [restart_warm], OUTPUT_TOKENS)  # the policy's prefill rate
        if tiers is not None:
            tiers.flush()  # its chunks written before the load is timed
        before = stats_snapshot(engine)
        served = step("l2", engine, p, i)
        phase_stats = stats_diff(stats_snapshot(engine), before)
        close_engine(engine)
        _add(restart_stats, phase_stats)
        del engine, tiers
        release(cfg)
        fresh_dir(root)
        runs.append(_run(served, whole, phase_stats, drop, got, i))

    return tiered_cfg, {
        **_row(n, length, bytes_per_token, whole, got, runs),
        "tier_stats_tiered": store_stats,
        "tier_stats_restart": restart_stats,
        "l1_size_gb": l1.size_gb,
    }


def _add(total: dict[str, float], diff: dict[str, float]) -> None:
    for k, v in diff.items():
        total[k] = max(total.get(k, v), v) if is_level(k) else total.get(k, 0) + v


def l2_choice(l2_tokens: int, whole: int) -> str:
    """What the restarted engine did with the prefix in L2: loaded all of its whole chunks, part of them (a load
    the policy abandoned part way, or chunks the store dropped), or none (recomputed)."""
    if l2_tokens <= 0:
        return "recomputed"
    return "loaded" if l2_tokens >= whole else "partly loaded"


def l2_load_gbps(stats: dict[str, float]) -> float | None:
    """The L2 load bandwidth of a phase's tier counters (stats_diff): the bytes its L2 reads moved over the
    seconds they took, at admission and by the prefetch thread (which a request queued on an idle engine starts
    at once); None without an L2 read."""
    loaded = (stats.get("loaded_bytes_l2") or 0) + (stats.get("prefetch_bytes") or 0)
    seconds = (stats.get("load_s_l2") or 0) + (stats.get("prefetch_s") or 0)
    return loaded / seconds / 1e9 if loaded and seconds else None


def _run(
    served: dict[str, int], whole: int, stats: dict[str, float], drop: dict[str, Any], got: _Phases, i: int
) -> dict[str, Any]:
    """One iteration's restart figures: the L2 policy's choice, its load bandwidth, the page cache drop."""
    outputs = {p: got.tokens[p][i] for p in PHASES}
    return {
        "l2_choice": l2_choice(served["l2"], whole),
        "l2_tokens": served["l2"],
        "l2_load_gbps": l2_load_gbps(stats),
        "l2_skipped_slow": stats.get("skipped_slow"),
        "l2_abandoned_loads": stats.get("abandoned_loads"),
        "page_cache": drop["status"],
        "page_cache_resident": drop.get("resident"),
        "outputs_identical": all(t == outputs["cold"] for t in outputs.values()),
        # the same computation over KV from each tier: equal wherever the tiers restore the KV bit for bit, also
        # where a prefill of the whole prompt (cold) rounds differently from one token over cached KV (bf16)
        "restored_outputs_identical": outputs["gpu"] == outputs["l1"] == outputs["l2"],
        "cached_tokens": {p: got.cached[p][i] for p in PHASES},
        "ttft_ms": {p: got.ttft[p][i] for p in PHASES},
        "tokens": outputs,
    }


def _row(
    n: int, length: int, bytes_per_token: int, whole: int, got: _Phases, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "prefix_len": n,
        "prompt_tokens": length,
        "chunk_prefix_tokens": whole,
        "kv_bytes_per_token": bytes_per_token,
        "kv_bytes": bytes_per_token * length,
    }
    cold = _median(got.ttft["cold"])
    for p in PHASES:
        rec[f"{p}_ttft_ms"] = _median(got.ttft[p])
        rec[f"{p}_ttft_ms_all"] = got.ttft[p]
        rec[f"{p}_ttft_frac"] = rec[f"{p}_ttft_ms"] / cold if cold and rec[f"{p}_ttft_ms"] is not None else None
        rec[f"{p}_cached_tokens"] = got.cached[p][-1] if got.cached[p] else None
    choices = {r["l2_choice"] for r in runs}
    rec["l2_choice"] = choices.pop() if len(choices) == 1 else "mixed"
    rec["l2_choice_all"] = [r["l2_choice"] for r in runs]
    bws = [r["l2_load_gbps"] for r in runs if r["l2_load_gbps"] is not None]
    rec["l2_load_gbps"] = _median(bws)
    rec["l2_load_gbps_all"] = [r["l2_load_gbps"] for r in runs]
    drops = {r["page_cache"] for r in runs}
    rec["page_cache"] = drops.pop() if len(drops) == 1 else "/".join(sorted(drops))
    rec["outputs_identical"] = all(r["outputs_identical"] for r in runs)
    rec["restored_outputs_identical"] = all(r["restored_outputs_identical"] for r in runs)
    rec["runs"] = runs
    return rec


def _summary_line(progress: Progress, r: Record) -> None:
    parts = [f"{p} {r[f'{p}_ttft_ms']:.2f}" for p in PHASES if r.get(f"{p}_ttft_ms") is not None]
    bw = r.get("l2_load_gbps")
    read = r.get("disk_read_gbps")
    l2 = (
        f"L2 {r['l2_choice']}"
        + (f" at {bw:.2f} GB/s" if bw else "")
        + (f" ({bw / read:.0%} of the directory's read)" if bw and read else "")
    )
    same = outputs_cell(r)
    log_line(
        progress,
        f"prefix {r['model']} {r['prefix_len']}: TTFT ms {', '.join(parts)}; {l2}; "
        f"page cache {r['page_cache']}; outputs {same}",
    )
