"""Where a multiturn run's wall time goes, per cache.tiers setting (the probe of bench/results/h200-issue13-s8).

    PYTHONPATH=. python scripts/multiturn_trace.py OUT_DIR TIERS[,TIERS...] [override ...]

e.g. `scripts/multiturn_trace.py /tmp/mt gpu,l1,l1_l2 model=qwen3-8b model.load_format=dummy executor=cudagraph
bench.clients=16 bench.rounds=6 bench.turn_len=1024 bench.output_len=16 cache.num_pages=2048
cache.l1.size_gb=24 cache.l2.path=/tmp/l2m` (the overrides compose conf/bench.yaml, as `xrt bench` does).

Runs the multiturn scenario's workload (xrt/bench/multiturn.py: the same seeded turns, bench.clients x
bench.rounds, after bench.warmup untimed requests) on a fresh engine per setting (L2 in a fresh bench-l2 under
cache.l2.path or bench.out_dir, removed after), and writes into OUT_DIR:
- trace-<tiers>.json: every engine.step() (start and host seconds, prefill tokens, generated tokens, running,
  waiting, free pages, finished requests), the rounds, and the host time (and calls) inside the scheduler's
  schedule, the KV cache's lookup / allocate, the runner's execute / launch_decode and the tiers' start_stores /
  prefetch;
- on CUDA, prof-<tiers>.json.gz: a torch.profiler capture (CUDA activity only) of the last round, summarised as
  the kernels' busy time and idle gaps, per stream, and the top kernels by GPU time;
- summary.txt: every setting's summary, also printed."""

from __future__ import annotations

import collections
import gzip
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xrt.bench.latency import build_engine
from xrt.bench.multiturn import WARMUP_TOKENS, multiturn_config, turn
from xrt.bench.tiers import (
    bench_l2_root,
    close_engine,
    fresh_dir,
    release,
    run_requests,
    served_by_tier,
    tier_manager,
    with_tiers,
)
from xrt.bench.workload import WARMUP_REP
from xrt.config import KVTiers, XrtConfig
from xrt.config.compose import load_config

COLUMNS = ["t", "dur", "prefill_tokens", "gen_tokens", "running", "waiting", "free_pages", "finished"]


def time_calls(obj: Any, name: str, acc: collections.Counter[str]) -> None:
    """obj.name, replaced on the instance by a wrapper that adds its host seconds and calls to acc."""
    f: Callable[..., Any] = getattr(obj, name)

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t0
            acc[name + "_n"] += 1

    setattr(obj, name, timed)


def _union(iv: list[tuple[float, float]]) -> tuple[float, list[float], float, float]:
    """Busy time of these (start, end) intervals, the idle gaps between them, first start, last end."""
    iv = sorted(iv)
    busy, gaps = 0.0, []
    cs = ce = None
    for s, e in iv:
        if ce is None or s > ce:
            if ce is not None and cs is not None:
                busy += ce - cs
                gaps.append(s - ce)
            cs, ce = s, e
        else:
            ce = max(ce, e)
    if ce is not None and cs is not None:
        busy += ce - cs
    return busy, gaps, (iv[0][0] if iv else 0.0), (max(e for _, e in iv) if iv else 0.0)


def gpu_summary(trace_path: Path, wall_s: float) -> str:
    """The profiled round from its chrome trace: kernels' busy time, idle gaps, per stream, top ops."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_stream: dict[tuple[bool, Any], list[tuple[float, float]]] = collections.defaultdict(list)
    for e in ops:
        by_stream[(e["cat"] == "kernel", e.get("tid"))].append((e["ts"], e["ts"] + e["dur"]))
    kernels = [x for (is_kernel, _), v in by_stream.items() if is_kernel for x in v]
    busy, gaps, s0, s1 = _union(kernels)
    big = sorted(gaps, reverse=True)
    long_gaps = [g for g in gaps if g > 1000]
    lines = [
        f"profiled round wall {wall_s * 1e3:.1f} ms",
        f"kernels (any stream): busy {busy / 1e3:.1f} ms of span {(s1 - s0) / 1e3:.1f} ms; idle gaps "
        f"{sum(gaps) / 1e3:.1f} ms in {len(gaps)} gaps; >1ms: {sum(long_gaps) / 1e3:.1f} ms in {len(long_gaps)}; "
        f"largest {[round(g / 1e3, 2) for g in big[:12]]}",
    ]
    for (is_kernel, tid), v in sorted(by_stream.items(), key=lambda kv: -sum(e - s for s, e in kv[1])):
        lines.append(f"  {'kernel' if is_kernel else 'memcpy'} stream {tid}: {len(v)} ops busy "
                     f"{_union(v)[0] / 1e3:.1f} ms")
    gpu_time: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for e in ops:
        gpu_time[e["name"][:90]] += e["dur"]
        count[e["name"][:90]] += 1
    lines.append("top ops by GPU time:")
    lines += [f"  {d / 1e3:9.1f} ms {count[n]:6d}x  {n}" for n, d in gpu_time.most_common(30)]
    return "\n".join(lines)


def trace_setting(cfg0: XrtConfig, tiers: KVTiers, out_dir: Path) -> str:
    """One cache.tiers setting's run: writes trace-<tiers>.json (and the profile); returns its summary."""
    b = cfg0.bench
    root = bench_l2_root(cfg0)
    cfg = with_tiers(cfg0, tiers, fresh_dir(root) if tiers is KVTiers.L1_L2 else None)
    engine: Any = build_engine(cfg)
    manager = tier_manager(engine)
    acc: collections.Counter[str] = collections.Counter()
    time_calls(engine.scheduler, "schedule", acc)
    time_calls(engine.scheduler.kv, "lookup", acc)
    time_calls(engine.scheduler.kv, "allocate", acc)
    time_calls(engine.runner, "execute", acc)
    time_calls(engine.runner, "launch_decode", acc)
    if manager is not None:
        time_calls(manager, "start_stores", acc)
        time_calls(manager, "prefetch", acc)
    for w in range(b.warmup):  # as the scenario warms up: an unrelated prompt
        rng = np.random.default_rng([cfg.seed, WARMUP_REP + w])
        run_requests(engine, [rng.integers(0, cfg.model.vocab_size, size=b.turn_len).tolist()], WARMUP_TOKENS)
    if manager is not None:
        manager.flush()

    trace: list[list[float]] = []
    step = engine.step

    def traced_step() -> Any:
        sch = engine.scheduler
        prefilled, generated = engine.num_prefill_tokens, engine.num_generated_tokens
        t0 = time.perf_counter()
        outs = step()
        t1 = time.perf_counter()
        trace.append([round(t0 - start, 6), round(t1 - t0, 6), engine.num_prefill_tokens - prefilled,
                      engine.num_generated_tokens - generated, len(sch.running), len(sch.waiting),
                      sch.kv.num_free_pages, len(outs)])
        return outs

    engine.step = traced_step
    histories: list[list[int]] = [[] for _ in range(b.clients)]
    rounds: list[dict[str, Any]] = []
    acc.clear()
    profiled = ""
    start = time.perf_counter()  # the trace's times are from here
    for r in range(b.rounds):
        prompts = [h + turn(cfg, c, r) for c, h in enumerate(histories)]
        prof = None
        if r == b.rounds - 1 and torch.cuda.is_available():
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.perf_counter()
        outs = run_requests(engine, prompts, b.output_len)
        dt = time.perf_counter() - t0
        if prof is not None:
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            path = out_dir / f"prof-{tiers.value}.json"
            prof.export_chrome_trace(str(path))
            profiled = gpu_summary(path, dt)
            with open(path, "rb") as f, gzip.open(f"{path}.gz", "wb") as g:
                shutil.copyfileobj(f, g)
            path.unlink()
        for c, (p, o) in enumerate(zip(prompts, outs, strict=True)):
            histories[c] = p + list(o.token_ids)
        rounds.append({"round": r, "s": dt, "cached": served_by_tier(outs),
                       "ttft_ms": sum(o.ttft_s for o in outs) / len(outs) * 1e3})
        print(f"{tiers.value} round {r}: {dt:.3f} s cached {rounds[-1]['cached']}", flush=True)
    wall = time.perf_counter() - start
    stats = manager.stats.as_dict() if manager is not None else {}
    close_engine(engine)
    engine = manager = None  # dropped, so release frees its memory
    release(cfg)
    shutil.rmtree(root, ignore_errors=True)

    prefill = [t for t in trace if t[2] > 0]
    decode = [t for t in trace if t[2] == 0 and t[3] > 0]
    other = [t for t in trace if t[2] == 0 and t[3] == 0]
    in_steps = sum(t[1] for t in trace)
    rows = collections.Counter(int(t[3]) for t in decode)
    by_rows: dict[int, list[float]] = collections.defaultdict(list)
    for t in decode:
        by_rows[int(t[3])].append(t[1])
    lines = [
        f"=== {tiers.value}: wall {wall:.3f} s, {len(trace)} steps, step() total {in_steps:.3f} s "
        f"(outside step {wall - in_steps:.3f} s)",
        f"prefill steps {len(prefill)} {sum(t[1] for t in prefill):.3f} s tokens {sum(t[2] for t in prefill):.0f}; "
        f"decode steps {len(decode)} {sum(t[1] for t in decode):.3f} s rows {sum(t[3] for t in decode):.0f}; "
        f"other steps {len(other)} {sum(t[1] for t in other):.3f} s",
        f"decode rows per step: {sorted(rows.items())}",
        "host time in: " + ", ".join(f"{k} {v:.0f}" if k.endswith("_n") else f"{k} {v:.3f} s"
                                     for k, v in sorted(acc.items())),
        "rounds: " + ", ".join(f"{x['s']:.3f}" for x in rounds),
        profiled or "(no CUDA: no GPU profile)",
        "decode step ms by rows: " + ", ".join(f"{k}: {1e3 * sum(v) / len(v):.2f} (n={len(v)})"
                                               for k, v in sorted(by_rows.items())),
    ]
    if stats:
        lines.append("tier stats: " + json.dumps({k: v for k, v in stats.items()
                                                  if isinstance(v, (int, float)) and v}))
    with open(out_dir / f"trace-{tiers.value}.json", "w") as f:
        json.dump({"columns": COLUMNS, "trace": trace, "rounds": rounds, "acc": acc}, f)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out_dir, settings, overrides = Path(argv[0]), [KVTiers(t) for t in argv[1].split(",")], argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    cfg = multiturn_config(load_config(overrides, config_name="bench"))
    summary = []
    for tiers in settings:
        text = trace_setting(cfg, tiers, out_dir)
        print(text, flush=True)
        summary.append(text)
    (out_dir / "summary.txt").write_text("\n\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
