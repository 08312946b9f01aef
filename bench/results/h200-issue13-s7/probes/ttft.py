"""Probe: TTFT of 8193-token cold prompts on a plain engine and an l1_l2 engine, back to back and after idle
gaps, with host timestamps of the step (from the request's arrival)."""
import random, shutil, sys, time
import torch
from xrt.config.compose import load_config
from xrt.engine.engine import LLMEngine
from xrt.config import SamplingArgs

model = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
base = [f"model={model}", "model.load_format=dummy", "executor=cudagraph", "cache.num_pages=8192",
        "scheduler.max_batched_tokens=8200", "model.max_model_len=8300"]
sp = SamplingArgs(max_tokens=4, ignore_eos=True)
rng = random.Random(0)

def prompt():
    return [rng.randrange(100, 150000) for _ in range(8193)]

def run(eng, label, marks):
    marks.clear()
    ids = prompt()
    eng.add_request(ids, sp)
    out = None
    while eng.has_unfinished():
        for o in eng.step():
            out = o
    m = " ".join(f"{k}={v * 1e3:.2f}" for k, v in marks.items())
    print(f"{label}: TTFT {out.ttft_s * 1e3:.2f} ms  [{m}]", flush=True)

def instrument(eng):
    marks = {}
    ex, samp, sched = eng.runner.execute, eng._sample, eng.scheduler.schedule
    def t(name):
        seqs = list(eng.scheduler.running) if hasattr(eng.scheduler, "running") else []
        marks.setdefault(name, time.perf_counter() - T0[0])
    T0 = [0.0]
    orig_add = eng.add_request
    def add(*a, **k):
        T0[0] = time.perf_counter(); return orig_add(*a, **k)
    def execute(step, *a, **k):
        t("exec_in"); r = ex(step, *a, **k); t("exec_out"); return r
    def sample(*a, **k):
        r = samp(*a, **k); t("sampled"); return r
    def schedule(*a, **k):
        t("sched_in"); r = sched(*a, **k); t("sched_out"); return r
    eng.add_request, eng.runner.execute, eng._sample, eng.scheduler.schedule = add, execute, sample, schedule
    return marks

tiered = ["cache=l1_l2", "cache.l2.path=/tmp/l2-ttft", "cache.l1.size_gb=8"]
for tiers, extra in (("gpu", []), ("store16", tiered), ("store0", tiered + ["cache.l1.store_programs=0"])):
    over = base + extra
    shutil.rmtree("/tmp/l2-ttft", ignore_errors=True)
    eng = LLMEngine(load_config(over))
    marks = instrument(eng)
    for _ in range(2):
        run(eng, f"{tiers} warm", marks)
    if eng.tiers: eng.tiers.flush()
    for i in range(3):
        run(eng, f"{tiers} back-to-back {i}", marks)
    for gap in (0.05, 0.5):
        for i in range(3):
            if eng.tiers: eng.tiers.flush()
            torch.cuda.synchronize(); time.sleep(gap)
            run(eng, f"{tiers} after flush+{gap}s idle {i}", marks)
    if eng.tiers:
        eng.tiers.close()
    del eng
    torch.cuda.empty_cache()
