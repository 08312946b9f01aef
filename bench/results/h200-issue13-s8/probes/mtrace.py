"""Probe: where a multiturn run's wall time goes. Runs the bench's multiturn workload (same prompts) for each
cache.tiers setting given, with a host timeline of every engine.step() (kind, tokens, batch, running, waiting,
free pages), host time inside kv.allocate / runner.execute / token read-back, and a torch.profiler capture of
the last round: GPU busy time by stream, idle gaps, top kernels.
usage: python mtrace.py OUTDIR tiers[,tiers...] override..."""
import collections, gzip, json, os, shutil, sys, time
import torch
from xrt.config import KVTiers
from xrt.config.compose import load_config
from xrt.bench.multiturn import multiturn_config, turn
from xrt.bench.tiers import bench_l2_root, fresh_dir, with_tiers, close_engine, release, run_requests, served_by_tier
from xrt.engine.engine import LLMEngine

out_dir, tiers_list, overrides = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
os.makedirs(out_dir, exist_ok=True)
cfg0 = multiturn_config(load_config(overrides))
b = cfg0.bench


def wrap(obj, name, acc):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t0
            acc[name + "_n"] += 1
    setattr(obj, name, g)


def gpu_summary(prof_path, wall_s):
    with open(prof_path) as f:
        ev = json.load(f)["traceEvents"]
    kern = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_stream = collections.defaultdict(list)
    for e in kern:
        by_stream[(e["cat"] == "kernel", e.get("tid"))].append((e["ts"], e["ts"] + e["dur"]))
    def union(iv):
        iv = sorted(iv); tot = 0; cs = ce = None; gaps = []
        for s, e in iv:
            if ce is None or s > ce:
                if ce is not None: tot += ce - cs; gaps.append(s - ce)
                cs, ce = s, e
            else:
                ce = max(ce, e)
        if ce is not None: tot += ce - cs
        return tot, gaps, (iv[0][0] if iv else 0), (max(e for _, e in iv) if iv else 0)
    lines = [f"profiled round wall {wall_s*1e3:.1f} ms"]
    allk = [x for (isk, _), v in by_stream.items() if isk for x in v]
    tot, gaps, s0, s1 = union(allk)
    big = sorted(gaps, reverse=True)
    lines.append(f"kernels (any stream): busy {tot/1e3:.1f} ms of span {(s1-s0)/1e3:.1f} ms; idle gaps {sum(gaps)/1e3:.1f} ms "
                 f"in {len(gaps)} gaps; >1ms: {sum(g for g in gaps if g>1000)/1e3:.1f} ms in {sum(1 for g in gaps if g>1000)}; "
                 f"largest {[round(g/1e3,2) for g in big[:12]]}")
    for (isk, tid), v in sorted(by_stream.items(), key=lambda kv: -sum(e - s for s, e in kv[1])):
        t, g, _, _ = union(v)
        lines.append(f"  {'kernel' if isk else 'memcpy'} stream {tid}: {len(v)} ops busy {t/1e3:.1f} ms")
    agg = collections.Counter(); cnt = collections.Counter()
    for e in kern:
        n = e["name"][:90]; agg[n] += e["dur"]; cnt[n] += 1
    lines.append("top ops by GPU time:")
    for n, d in agg.most_common(30):
        lines.append(f"  {d/1e3:9.1f} ms {cnt[n]:6d}x  {n}")
    return "\n".join(lines)


summary = []
for tname in tiers_list:
    tiers = KVTiers(tname)
    root = bench_l2_root(cfg0)
    cfg = with_tiers(cfg0, tiers, fresh_dir(root) if tiers is KVTiers.L1_L2 else None)
    eng = LLMEngine(cfg)
    acc = collections.Counter()
    wrap(eng.scheduler.kv, "allocate", acc)
    wrap(eng.scheduler.kv, "lookup", acc)
    wrap(eng.runner, "execute", acc)
    wrap(eng.runner, "launch_decode", acc)
    wrap(eng.scheduler, "schedule", acc)
    if eng.tiers is not None:
        wrap(eng.tiers, "start_stores", acc)
        wrap(eng.tiers, "prefetch", acc)
    for w in range(b.warmup):
        run_requests(eng, [list(range(100, 100 + b.turn_len))], 8)
    if eng.tiers is not None:
        eng.tiers.flush()
    trace = []
    orig_step = eng.step
    def step():
        sch = eng.scheduler
        pre, gen = eng.num_prefill_tokens, eng.num_generated_tokens
        t0 = time.perf_counter()
        outs = orig_step()
        t1 = time.perf_counter()
        trace.append([round(t0 - T0, 6), round(t1 - t0, 6), eng.num_prefill_tokens - pre, eng.num_generated_tokens - gen,
                      len(sch.running), len(sch.waiting), sch.kv.num_free_pages, len(outs)])
        return outs
    eng.step = step
    histories = [[] for _ in range(b.clients)]
    rounds = []
    acc.clear()
    T0 = time.perf_counter()
    prof_txt = ""
    for r in range(b.rounds):
        prompts = [h + turn(cfg, c, r) for c, h in enumerate(histories)]
        last = r == b.rounds - 1
        prof = None
        if last:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.perf_counter()
        outs = run_requests(eng, prompts, b.output_len)
        dt = time.perf_counter() - t0
        if prof is not None:
            torch.cuda.is_available() and torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            p = os.path.join(out_dir, f"prof-{tname}.json")
            prof.export_chrome_trace(p)
            prof_txt = gpu_summary(p, dt)
            with open(p, "rb") as f, gzip.open(p + ".gz", "wb") as g:
                shutil.copyfileobj(f, g)
            os.unlink(p)
        for c, (p_, o) in enumerate(zip(prompts, outs)):
            histories[c] = p_ + list(o.token_ids)
        rounds.append(dict(round=r, s=dt, cached=served_by_tier(outs), ttft_ms=sum(o.ttft_s for o in outs) / len(outs) * 1e3))
        print(f"{tname} round {r}: {dt:.3f} s cached {rounds[-1]['cached']}", flush=True)
    wall = time.perf_counter() - T0
    stats = eng.tiers.stats.as_dict() if eng.tiers is not None else {}
    close_engine(eng)
    del eng
    release(cfg)
    shutil.rmtree(root, ignore_errors=True)
    # summary
    pre = [t for t in trace if t[2] > 0]
    dec = [t for t in trace if t[2] == 0 and t[3] > 0]
    other = [t for t in trace if t[2] == 0 and t[3] == 0]
    stepsum = sum(t[1] for t in trace)
    bs = collections.Counter(t[3] for t in dec)
    s = [f"=== {tname}: wall {wall:.3f} s, {len(trace)} steps, step() total {stepsum:.3f} s (outside step {wall - stepsum:.3f} s)",
         f"prefill steps {len(pre)} {sum(t[1] for t in pre):.3f} s tokens {sum(t[2] for t in pre)}; decode steps {len(dec)} "
         f"{sum(t[1] for t in dec):.3f} s rows {sum(t[3] for t in dec)}; other steps {len(other)} {sum(t[1] for t in other):.3f} s",
         f"decode rows per step: {sorted(bs.items())}",
         "host time in: " + ", ".join(f"{k} {v:.3f}" + ("" if k.endswith('_n') else " s") for k, v in sorted(acc.items())),
         "rounds: " + ", ".join(f"{x['s']:.3f}" for x in rounds),
         prof_txt]
    # per-decode-batch step time
    bt = collections.defaultdict(list)
    for t in dec:
        bt[t[3]].append(t[1])
    s.append("decode step ms by rows: " + ", ".join(f"{k}: {1e3*sum(v)/len(v):.2f} (n={len(v)})" for k, v in sorted(bt.items())))
    if stats:
        s.append("tier stats: " + json.dumps({k: v for k, v in stats.items() if isinstance(v, (int, float)) and v}))
    txt = "\n".join(s)
    print(txt, flush=True)
    summary.append(txt)
    with open(os.path.join(out_dir, f"trace-{tname}.json"), "w") as f:
        json.dump(dict(columns=["t", "dur", "prefill_tokens", "gen_tokens", "running", "waiting", "free_pages", "finished"],
                       trace=trace, rounds=rounds, acc=acc), f)
with open(os.path.join(out_dir, "summary.txt"), "w") as f:
    f.write("\n\n".join(summary))
