"""GPU time of one prefill and one replayed decode step per batch, and where it goes, kernel by kernel.

    python scripts/gpu_breakdown.py [--batch 1,8,100] [--input 1024] [--replays 50] [overrides ...]

Builds the CUDA-graph runner on the bench config (Qwen3-0.6B shape, dummy weights, bf16), then for each
batch: prefills `batch` fresh sequences of `input` tokens (host-timed, synchronized), stages one decode
step at that context and replays its graph `replays` times back to back, timed with CUDA events, so the
figure is the graph's GPU time with no host work between replays (the floor of TPOT for this executor).
Both are profiled with the torch profiler and the CUDA kernels are summed by name per step, which shows
what a fused or faster kernel would save. Compare with `xrt bench`'s TPOT: the difference is host time
the overlap did not hide."""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from xrt.bench.setup import bench_config
from xrt.config.compose import load_config
from xrt.executor.cudagraph import CudaGraphRunner
from xrt.executor.factory import build_runner
from xrt.executor.step import SeqChunk, StepInput


def kernel_table(prof: profile, steps: int, rows: int) -> str:
    """CUDA kernels (and memcpy/memset) summed by name, per step, largest first."""
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        entry = per_name[ev.name[:90]]
        entry[0] += ev.device_time
        entry[1] += 1
    total = sum(v[0] for v in per_name.values()) / steps
    lines = [f"  total {total:9.1f} us per step over {steps} step(s)",
             f"  {'us/step':>9} {'calls/step':>10} {'us/call':>8}  kernel"]
    for name, (us, calls) in sorted(per_name.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(f"  {us / steps:9.1f} {calls / steps:10.1f} {us / max(calls, 1):8.2f}  {name}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", default="1,8,100", help="comma-separated batch sizes")
    ap.add_argument("--input", type=int, default=1024)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--rows", type=int, default=20)
    args, overrides = ap.parse_known_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_breakdown: needs a CUDA device")
    cfg = load_config(["executor=cudagraph", *overrides], config_name="bench")
    batches = [int(b) for b in args.batch.split(",")]
    cfg.bench.batch = batches
    cfg.bench.input_len = args.input
    cfg = bench_config(cfg)
    runner = build_runner(cfg)
    assert isinstance(runner, CudaGraphRunner)
    ps, vocab, rng = runner.page_size, cfg.model.vocab_size, random.Random(0)
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    for batch in batches:
        pages = -(-(args.input + 1) // ps)
        tables = [list(range(i * pages, (i + 1) * pages)) for i in range(batch)]
        prefill = StepInput(True, [SeqChunk([rng.randrange(vocab) for _ in range(args.input)], 0, t)
                                   for t in tables])
        with torch.inference_mode():
            for _ in range(3):
                runner.execute(prefill)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runner.execute(prefill)
            torch.cuda.synchronize()
            host_ms = (time.perf_counter() - t0) * 1e3
            with profile(activities=acts) as prof_prefill:
                runner.execute(prefill)
                torch.cuda.synchronize()
            decode = StepInput(False, [SeqChunk([1], args.input, t) for t in tables])
            bucket = runner.buckets.bucket_for(batch)
            if bucket is None:
                print(f"batch {batch}: above the largest decode graph; skipped")
                continue
            runner._stage(decode, bucket)
            graph = runner.graphs[bucket].graph
            for _ in range(5):
                graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(args.replays):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            replay_ms = start.elapsed_time(end) / args.replays
            with profile(activities=acts) as prof_decode:
                for _ in range(5):
                    graph.replay()
                torch.cuda.synchronize()
        print(f"== batch {batch} (bucket {bucket}), input {args.input}: prefill step {host_ms:.3f} ms (host, "
              f"synchronized); decode graph replay {replay_ms * 1e3:.1f} us (GPU, back to back)")
        print("-- prefill kernels --")
        print(kernel_table(prof_prefill, 1, args.rows))
        print("-- decode kernels (graph replay) --")
        print(kernel_table(prof_decode, 5, args.rows))


if __name__ == "__main__":
    main()
