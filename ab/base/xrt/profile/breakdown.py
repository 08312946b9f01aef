"""profile.mode=breakdown (CUDA): for each batch, the host-timed prefill of `batch` fresh sequences of
input_len tokens, and one decode step at that context staged into its CUDA graph and replayed `iters` times
back to back, timed with CUDA events: the graph's GPU time with no host work between replays, the floor of
TPOT for this executor (the bench's TPOT minus it is host time the overlap did not hide). Both are profiled
and their kernels summed per step, which shows what a fused or faster kernel would save. Needs
executor=cudagraph."""

from __future__ import annotations

import random
import time

import torch
from torch.profiler import profile

from xrt.bench.setup import BenchError
from xrt.config import ExecutorKind, XrtConfig
from xrt.executor.factory import build_runner
from xrt.executor.step import SeqChunk, StepInput
from xrt.profile.kernel_sum import activities, kernel_table
from xrt.profile.runner_parts import decode_replay
from xrt.profile.setup import Emit, fresh_prefill, header, profile_config

PROFILED_STEPS = 5


def run_breakdown(cfg: XrtConfig, emit: Emit) -> None:
    if cfg.executor.kind is not ExecutorKind.CUDAGRAPH:
        raise BenchError("profile.mode: breakdown replays the decode CUDA graphs; add executor=cudagraph")
    cfg = profile_config(cfg, extra_tokens=1)
    p = cfg.profile
    runner = build_runner(cfg)
    emit(header("GPU time per step, kernel by kernel", runner.device, cfg))
    rng, acts = random.Random(cfg.seed), activities(runner.device)
    for batch in p.batch:
        prefill = fresh_prefill(batch, p.input_len, runner.page_size, runner.num_pages, runner.vocab_size, rng)
        with torch.inference_mode():
            for _ in range(p.warmup):
                runner.execute(prefill)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runner.execute(prefill)
            torch.cuda.synchronize()
            prefill_ms = (time.perf_counter() - t0) * 1e3
            with profile(activities=acts) as prof_prefill:
                runner.execute(prefill)
                torch.cuda.synchronize()
            decode = StepInput(False, [SeqChunk([1], p.input_len, c.page_table) for c in prefill.seqs])
            staged = decode_replay(runner, decode)
            if staged is None:
                emit(f"\n## batch {batch}: above the largest decode graph; skipped")
                continue
            bucket, replay = staged
            for _ in range(p.warmup):
                replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(p.iters):
                replay()
            end.record()
            torch.cuda.synchronize()
            replay_us = start.elapsed_time(end) / p.iters * 1e3
            with profile(activities=acts) as prof_decode:
                for _ in range(PROFILED_STEPS):
                    replay()
                torch.cuda.synchronize()
        emit(f"\n## batch {batch} (bucket {bucket}), input {p.input_len}: prefill step {prefill_ms:.3f} ms (host, "
             f"synchronized); decode graph replay {replay_us:.1f} us (GPU, back to back)")
        if p.rows:
            emit("\n### prefill kernels\n\n" + "\n".join(kernel_table(prof_prefill, 1, p.rows)))
            emit("\n### decode kernels (graph replay)\n\n" + "\n".join(kernel_table(prof_decode, PROFILED_STEPS,
                                                                                     p.rows)))
