"""Where a step's time goes: wall time per prefill/decode step and the torch profiler's top ops
(CPU and CUDA) for one batch, on the bench's config. Usage:
    python scripts/profile_step.py [--batch 1] [--input 1024] [--steps 20] [overrides ...]
e.g. `python scripts/profile_step.py --batch 8 executor=cudagraph` on a GPU machine."""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch.profiler import ProfilerActivity, profile

from xrt.bench.setup import bench_config
from xrt.config.compose import load_config
from xrt.engine.engine import LLMEngine


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=25)
    args, overrides = ap.parse_known_args()
    cfg = load_config(overrides, config_name="bench")
    cfg.bench.batch = [args.batch]
    cfg.bench.input_len = args.input
    cfg = bench_config(cfg)
    engine = LLMEngine(cfg)
    rng = random.Random(0)
    sampling = {"max_tokens": args.steps + 4, "ignore_eos": True, "temperature": 0.0}

    def add() -> None:
        for _ in range(args.batch):
            engine.add_request([rng.randrange(cfg.model.vocab_size) for _ in range(args.input)], sampling)

    add()  # warm-up round
    while engine.has_unfinished():
        engine.step()
    add()
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    t0 = time.perf_counter()
    engine.step()
    sync()
    ttft = time.perf_counter() - t0
    with profile(activities=acts) as prof_prefill:
        add()
        engine.step()
        sync()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        engine.step()
        sync()
        times.append(time.perf_counter() - t0)
    with profile(activities=acts) as prof_decode:
        for _ in range(5):
            engine.step()
        sync()
    times.sort()
    print(f"batch {args.batch} input {args.input}: prefill step {ttft * 1e3:.2f} ms; decode step median "
          f"{times[len(times) // 2] * 1e3:.3f} ms (min {times[0] * 1e3:.3f})")
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    print("== prefill (one step) ==")
    print(prof_prefill.key_averages().table(sort_by=sort, row_limit=args.rows))
    print("== decode (5 steps) ==")
    print(prof_decode.key_averages().table(sort_by=sort, row_limit=args.rows))
    print("== decode by CPU time ==")
    print(prof_decode.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
