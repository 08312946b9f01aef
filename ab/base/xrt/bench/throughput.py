"""Offline-throughput scenario: num_requests requests with input and output lengths uniform in
[min_len, max_len], all submitted at once; total tokens/s over the wall time to drain them."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from xrt.bench.clock import StepClock
from xrt.bench.engine_timing import Engine, Progress, check_outputs, drive, submit
from xrt.bench.environment import adjusted, config_dict, environment
from xrt.bench.latency import build_engine, free_memory
from xrt.bench.results import Record
from xrt.bench.setup import bench_config
from xrt.bench.workload import WARMUP_REP, prompts_of_lengths, random_lengths
from xrt.config import XrtConfig
from xrt.executor.device import resolve_device, resolve_dtype

WARMUP_REQUESTS = 4


def _drain(engine: Engine, clock: StepClock, prompts: list[list[int]], out_lens: list[int]) -> float:
    """Submit everything, step until done; wall seconds."""
    expected = submit(engine, prompts, out_lens)
    check_outputs(drive(engine, clock), expected)
    return sum(clock.wall_ms()) / 1e3


def run_throughput(
    cfg: XrtConfig, progress: Progress, engine_factory: Callable[[XrtConfig], Engine] = build_engine
) -> list[Record]:
    given = config_dict(cfg)
    cfg = bench_config(cfg)
    b = cfg.bench
    device = resolve_device(cfg)
    lengths = random_lengths(b.num_requests, b.min_len, b.max_len, cfg.seed)
    in_lens, out_lens = [i for i, _ in lengths], [o for _, o in lengths]
    engine = engine_factory(cfg)
    clock = StepClock(device)
    vocab = cfg.model.vocab_size
    warm = lengths[:WARMUP_REQUESTS]
    for w in range(b.warmup):
        _drain(engine, clock, prompts_of_lengths(vocab, [i for i, _ in warm], cfg.seed, WARMUP_REP + w),
               [min(o, 16) for _, o in warm])
    walls = []
    for i in range(b.iters):
        walls.append(_drain(engine, clock, prompts_of_lengths(vocab, in_lens, cfg.seed, i), out_lens))
        progress(f"[bench] throughput run {i + 1}/{b.iters}: {b.num_requests} requests in {walls[-1]:.2f} s")
    del engine
    free_memory(device)
    wall = statistics.median(walls)
    tokens_in, tokens_out = sum(in_lens), sum(out_lens)
    rec: dict[str, Any] = {
        "scenario": "throughput",
        "status": "ok",
        "executor": cfg.executor.kind.value,
        "model": cfg.model.name,
        "dtype": str(resolve_dtype(cfg, device)).removeprefix("torch."),
        "num_requests": b.num_requests,
        "min_len": b.min_len,
        "max_len": b.max_len,
        "warmup": b.warmup,
        "iters": b.iters,
        "tp": cfg.parallel.tp,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "wall_s": wall,
        "wall_s_all": walls,
        "tokens_per_s": (tokens_in + tokens_out) / wall,
        "output_tokens_per_s": tokens_out / wall,
        **environment(device),
        "config": given,
        "adjusted": adjusted(given, config_dict(cfg)),
    }
    progress(f"[bench] throughput {rec['executor']}: {rec['tokens_per_s']:.0f} tokens/s "
             f"({rec['output_tokens_per_s']:.0f} output tokens/s), wall {wall:.2f} s")
    return [rec]
