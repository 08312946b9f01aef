"""Session probe (not shipped): where a GPU prefix hit's and an L1 hit's TTFT goes at 8k tokens."""
import random, sys, time, json
import torch
def sync():
    if torch.cuda.is_available(): torch.cuda.synchronize()
from torch.profiler import profile, ProfilerActivity
from xrt import load_config
from xrt.engine.engine import LLMEngine
from xrt.bench.tiers import run_requests, ttft_ms

model = sys.argv[1]; n = int(sys.argv[2]); out = sys.argv[3]; ex = sys.argv[4] if len(sys.argv) > 4 else "eager"
ov = [f"model={model}", "model.load_format=dummy", f"model.max_model_len={n+64}",
      f"scheduler.max_batched_tokens={n+64}", "cache.num_pages=4096", "cache=l1", "cache.l1.size_gb=6", f"executor={ex}"]
cfg = load_config(ov)
eng = LLMEngine(cfg)
rng = random.Random(0)
V = cfg.model.vocab_size
def prompt(): return [rng.randrange(V) for _ in range(n + 1)]
res = {}
for rep in range(3):
    p = prompt()
    (o,) = run_requests(eng, [p], 2); cold = ttft_ms(o)
    eng.tiers.flush()
    (o,) = run_requests(eng, [p], 2); hit = ttft_ms(o)
    eng.tiers.evict()
    (o,) = run_requests(eng, [p], 2); l1 = ttft_ms(o)
    print(f"{model} {n}: cold {cold:.1f} gpu-hit {hit:.1f} l1-hit {l1:.1f} cached {o.cached_tokens}", flush=True)
    res.setdefault("rows", []).append([cold, hit, l1])
p = prompt(); run_requests(eng, [p], 2); eng.tiers.flush()
lines = []
for phase in ("gpu", "l1"):
    if phase == "l1":
        eng.tiers.evict()
    sync()
    # host phases by hand
    t0 = time.perf_counter()
    rid = eng.add_request(p, {"max_tokens": 2, "ignore_eos": True})
    t1 = time.perf_counter()
    sch = eng.scheduler.schedule(); sync(); t2 = time.perf_counter()
    logits = eng.runner.execute(sch.step); t3 = time.perf_counter(); sync(); t4 = time.perf_counter()
    eng.scheduler.postprocess(sch)
    toks = eng._sample(logits, sch.sampled_seqs); t5 = time.perf_counter()
    for s, t in zip(sch.sampled_seqs, toks): eng._append(s, t, t5)
    while eng.has_unfinished(): eng.step()
    lines.append(f"{phase}: add {1e3*(t1-t0):.2f} schedule(+load) {1e3*(t2-t1):.2f} execute-launch {1e3*(t3-t2):.2f} "
                 f"execute-sync {1e3*(t4-t3):.2f} sample {1e3*(t5-t4):.2f} ms")
    print(lines[-1], flush=True)
    p = prompt(); run_requests(eng, [p], 2); eng.tiers.flush()
    if phase == "l1":
        eng.tiers.evict()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_requests(eng, [p], 1)
        sync()
    t = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    print(t[:6000], flush=True)
    lines.append(t)
    p = prompt(); run_requests(eng, [p], 2); eng.tiers.flush()
open(out, "w").write(json.dumps(res) + "\n" + "\n".join(lines))
