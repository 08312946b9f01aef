"""profile.mode=step (any device): where a step's time goes on the host and on the device, per batch.
- The runner's eager prefill of `batch` fresh sequences of input_len tokens, part by part: prepare, plan, the
  forward as the host sees it (on a GPU, the launch time of every kernel) beside its device time (host >
  device: launches are the bottleneck), logits, the whole step synchronized; with the other threads' CPU
  time and the garbage collector's during those steps. This is the path of a prefill no graph fits (a cached
  prefix, a chunk, more sequences or tokens than the prefill graphs take), not of one that replays a graph.
- The engine's prefill step and decode steps (median) as users run them (with executor=cudagraph, the prefill
  graph where one fits), the prefill step part by part (xrt.profile.prefill_parts: host parts, and on CUDA the
  device idle before the graph, the graph, the tail), and the torch profiler's top ops.
Once per run: process state, a Python loop and a kernel launch timed before and after building the runner,
and the host cost of an xrt op call through its entry point against its implementation. Compare executors
with one run each (`executor=eager`, `executor=cudagraph`)."""

from __future__ import annotations

import gc
import random
import statistics
import time

from torch.profiler import profile

from xrt.bench.markdown import md_table
from xrt.config import SamplingArgs, XrtConfig
from xrt.engine.engine import LLMEngine
from xrt.executor.device import resolve_device
from xrt.executor.factory import build_runner
from xrt.executor.runner import ModelRunner
from xrt.profile import process
from xrt.profile.kernel_sum import activities, top_ops
from xrt.profile.prefill_parts import report, time_prefill_steps
from xrt.profile.runner_parts import describe, num_layers, sync, time_prefill_parts
from xrt.profile.setup import Emit, fresh_prefill, header, profile_config

PROFILED_STEPS = 5


def _us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


def runner_prefill(runner: ModelRunner, cfg: XrtConfig, batch: int, rng: random.Random) -> list[str]:
    p = cfg.profile
    steps = [fresh_prefill(batch, p.input_len, runner.page_size, runner.num_pages, runner.vocab_size, rng)
             for _ in range(p.warmup + p.iters)]
    time_prefill_parts(runner, steps[: p.warmup])
    gc_timer = process.GcTimer()
    gc.callbacks.append(gc_timer)
    before = process.thread_cpu_seconds()
    wall0 = time.perf_counter()
    try:
        t = time_prefill_parts(runner, steps[p.warmup :])
    finally:
        gc.callbacks.remove(gc_timer)
    wall, after = time.perf_counter() - wall0, process.thread_cpu_seconds()
    layers, fwd = num_layers(runner), _us(t["forward_host"])
    rows = [["step (synchronized)", f"{_us(t['step']):.1f}", ""], ["prepare", f"{_us(t['prepare']):.1f}", ""],
            ["plan", f"{_us(t['plan']):.1f}", ""], ["forward, host", f"{fwd:.1f}", f"{fwd / layers:.1f}"],
            ["logits, host", f"{_us(t['logits_host']):.1f}", ""]]
    if t["gpu"]:
        gpu = _us(t["gpu"])
        rows.append([f"forward, device ({'host' if fwd > gpu else 'device'}-bound)", f"{gpu:.1f}",
                     f"{gpu / layers:.1f}"])
    return [f"### runner prefill, median of {p.iters}", "",
            *md_table(["part", "us", "us per layer"], rows, [False, True, True]), "",
            f"timed steps: wall {wall * 1e3:.1f} ms, {process.busy_threads(before, after)}; garbage collector "
            f"{gc_timer.seconds * 1e3:.2f} ms in {gc_timer.collections} collections (gen 0/1/2)"]


def engine_steps(engine: LLMEngine, cfg: XrtConfig, batch: int, rng: random.Random) -> list[str]:
    p, device = cfg.profile, engine.runner.device
    sampling = SamplingArgs(max_tokens=p.warmup + p.iters + PROFILED_STEPS + 2, ignore_eos=True, temperature=0.0)

    def add() -> None:
        for _ in range(batch):
            engine.add_request([rng.randrange(engine.vocab_size) for _ in range(p.input_len)], sampling)

    def drain() -> None:
        while engine.has_unfinished():
            engine.step()

    def timed_step() -> float:
        t0 = time.perf_counter()
        engine.step()
        sync(device)
        return (time.perf_counter() - t0) * 1e3

    add()
    drain()  # warm-up round
    add()
    sync(device)
    prefill_ms = timed_step()
    for _ in range(p.warmup):
        engine.step()
    times = sorted(timed_step() for _ in range(p.iters))
    acts = activities(device)
    with profile(activities=acts) as prof_decode:
        for _ in range(PROFILED_STEPS):
            engine.step()
        sync(device)
    drain()
    with profile(activities=acts) as prof_prefill:
        add()
        engine.step()
        sync(device)
    drain()
    time_prefill_steps(engine, batch, p.input_len, p.warmup, rng)
    parts = report(time_prefill_steps(engine, batch, p.input_len, p.iters, rng))
    lines = [f"### engine: prefill step {prefill_ms:.2f} ms; decode step median {times[len(times) // 2]:.3f} ms "
             f"(min {times[0]:.3f}, {p.iters} steps)", "", *parts]
    if p.rows:
        by = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        lines += ["", "prefill (one step):", top_ops(prof_prefill, by, p.rows),
                  "", f"decode ({PROFILED_STEPS} steps):", top_ops(prof_decode, by, p.rows),
                  "", "decode by self CPU time:", top_ops(prof_decode, "self_cpu_time_total", p.rows)]
    return lines


def run_step(cfg: XrtConfig, emit: Emit) -> None:
    p = cfg.profile
    cfg = profile_config(cfg, extra_tokens=p.warmup + p.iters + PROFILED_STEPS + 2)
    device = resolve_device(cfg)
    loop_before, launch_before = process.python_loop_us(), process.launch_us(device)
    t0 = time.perf_counter()
    runner = build_runner(cfg)
    built = time.perf_counter() - t0
    loop_after, launch_after = process.python_loop_us(), process.launch_us(device)
    emit(header("host and device time of a step", runner.device, cfg))
    emit(f"\n{describe(runner)}; built in {built:.1f} s")
    emit(f"before / after building the runner: pure-Python loop {loop_before:.0f} / {loop_after:.0f} us, one "
         f"torch kernel launch {launch_before:.2f} / {launch_after:.2f} us")
    engine = LLMEngine(cfg, runner=runner)
    rng = random.Random(cfg.seed)
    for batch in p.batch:
        emit(f"\n## batch {batch}, input {p.input_len}\n")
        emit("\n".join(runner_prefill(runner, cfg, batch, rng)))
        emit("\n" + "\n".join(engine_steps(engine, cfg, batch, rng)))
    m = cfg.model
    costs = process.op_call_costs(runner.device, runner.dtype, m.hidden_size, m.intermediate_size,
                                  m.num_attention_heads, m.num_key_value_heads, m.head_dim, cfg.cache.page_size)
    emit("\n## one op call, host time (us): entry point vs implementation called directly\n")
    emit("\n".join(md_table(["op", "entry", "implementation", "dispatch"],
                            [[n, f"{e:.2f}", f"{i:.2f}", f"{e - i:.2f}"] for n, e, i in costs],
                            [False, True, True, True])))
    emit(f"\nprocess state: {process.process_state()}")
