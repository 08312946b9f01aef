"""Host overhead of one prefill step, per layer, on whatever device is present.

    python scripts/prefill_overhead.py [--batch 1] [--input 1024] [--iters 20] [--profile] [overrides ...]

Builds the runner the config asks for (bench config: Qwen3-0.6B shape, dummy weights; on a machine without
CUDA the default overrides make it the tiny model in float32), then times a prefill of `batch` fresh
sequences of `input` tokens: prepare, plan, the forward pass as the host sees it (no synchronize: on a GPU
this is the launch time of every kernel), logits, and the whole step with a synchronize. Also reported:
- GPU time of the forward (CUDA events) beside its host time: host > GPU means launches are the bottleneck;
- the cost of one call of each xrt op through its Python entry point vs its implementation called directly;
- CPU time of the process's other threads and time spent in Python's garbage collector during the timed
  steps (a busy background thread or long collections slow every launch of the main thread), and a fixed
  pure-Python loop and one small kernel launch timed before and after building the runner (slower after:
  the process's state, e.g. captured graphs or a busy thread, slows the CPU or the driver for everything);
- with --profile, the torch profiler's top ops by self CPU time.
Run it once per executor (`executor=cudagraph` builds the CUDA-graph runner, capture included) and compare
the per-layer host times: the prefill code path is the same, so a difference is process state."""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import threading
import time
from collections.abc import Callable

import torch

from xrt.bench.setup import bench_config
from xrt.config.compose import load_config
from xrt.executor.factory import build_runner
from xrt.executor.runner import ModelRunner
from xrt.executor.step import SeqChunk, StepInput

CPU_DEFAULTS = ["model=qwen3-tiny", "model.load_format=dummy", "model.dtype=float32", "device=cpu"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefill_step(runner: ModelRunner, batch: int, input_len: int, rng: random.Random) -> StepInput:
    """`batch` fresh sequences on disjoint pages (no cached prefix)."""
    pages_per_seq = -(-input_len // runner.page_size)
    if batch * pages_per_seq > runner.num_pages:
        raise SystemExit(f"--batch {batch} x --input {input_len} needs {batch * pages_per_seq} KV pages, "
                         f"the cache has {runner.num_pages}")
    vocab = runner.cfg.model.vocab_size
    seqs = [
        SeqChunk(token_ids=[rng.randrange(vocab) for _ in range(input_len)], start_pos=0,
                 page_table=list(range(i * pages_per_seq, (i + 1) * pages_per_seq)))
        for i in range(batch)
    ]
    return StepInput(is_prefill=True, seqs=seqs)


def thread_cpu_seconds() -> dict[int, tuple[str, float]]:
    """tid -> (name, user + system CPU seconds) from /proc (Linux); empty elsewhere."""
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    base = "/proc/self/task"
    if not os.path.isdir(base):
        return out
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


class GcTimer:
    """Time spent in Python's garbage collector while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1


def python_loop_us() -> float:
    """A fixed pure-Python workload (best of 5): slower after the runner is built means the CPU itself is
    slower for this thread (contention, frequency), not anything torch or CUDA does per call."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        acc = 0
        for i in range(100_000):
            acc += i & 7
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def launch_us(device: torch.device) -> float:
    """Host time of one small torch kernel launch (best of 5 blocks); 0 without CUDA."""
    if device.type != "cuda":
        return 0.0
    x = torch.zeros(16, device=device)
    return call_cost_us(x.add_, (1.0,), device, 1000)


def process_state() -> str:
    """Global state that slows every Python call or torch op when set: trace/profile hooks, torch function
    or dispatch modes, the garbage collector's thresholds."""
    import sys

    return (f"sys trace {sys.gettrace() is not None}, sys profile {sys.getprofile() is not None}, "
            f"torch function mode {torch._C._is_torch_function_mode_enabled()}, "
            f"dispatch modes {torch._C._len_torch_dispatch_stack()}, gc enabled {gc.isenabled()} "
            f"thresholds {gc.get_threshold()} tracked objects {len(gc.get_objects())}")


def median_us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


def time_steps(runner: ModelRunner, steps: list[StepInput]) -> dict[str, list[float]]:
    device = runner.device
    t: dict[str, list[float]] = {k: [] for k in ("prepare", "plan", "forward_host", "logits_host", "step", "gpu")}
    cuda = device.type == "cuda"
    for step in steps:
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            ids, meta = runner.prepare(step)
            t1 = time.perf_counter()
            runner.backend.plan(meta)
            t2 = time.perf_counter()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            hidden = runner.forward_hidden(ids, meta)
            if cuda:
                end.record()
            t3 = time.perf_counter()
            logits = runner.logits(hidden, meta).float()
            t4 = time.perf_counter()
            logits.cpu()
        t5 = time.perf_counter()
        for key, v in zip(("prepare", "plan", "forward_host", "logits_host", "step"),
                          (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t0), strict=True):
            t[key].append(v)
        if cuda:
            t["gpu"].append(start.elapsed_time(end) / 1e3)
    return t


def call_cost_us(fn: Callable[..., object], args: tuple, device: torch.device, iters: int) -> float:
    """Host time of one call: the best of 5 blocks of iters / 5 calls (other processes only add time)."""
    for _ in range(20):
        fn(*args)
    block, best = max(iters // 5, 1), float("inf")
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(block):
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / block)
    sync(device)
    return best * 1e6


def op_call_costs(device: torch.device, dtype: torch.dtype, iters: int = 2000) -> list[tuple[str, float, float]]:
    """(op, us per call through xrt.ops' Python entry point, us per call of the implementation itself), host
    time only, one token at the 0.6B widths; the difference is what dispatch adds to every call."""
    import xrt.ops  # noqa: F401  (registers the ops)
    from xrt.ops import attention as att_ops
    from xrt.ops import compute
    from xrt.ops.registry import implementation

    kw = {"device": device, "dtype": dtype}
    hidden, inter, h, kv, d, page = 1024, 3072, 16, 8, 128, 16
    x, res, w = torch.randn(1, hidden, **kw), torch.randn(1, hidden, **kw), torch.ones(hidden, **kw)
    gu = torch.randn(1, 2 * inter, **kw)
    qkv, hw = torch.randn(1, (h + 2 * kv) * d, **kw), torch.ones(d, **kw)
    cos_sin = torch.zeros(16, d, device=device, dtype=torch.float32)
    pos = torch.zeros(1, dtype=torch.int64, device=device)
    cache = torch.zeros(2, 2, page, kv, d, **kw)
    slots = torch.zeros(1, dtype=torch.int64, device=device)
    cases: list[tuple[str, Callable[..., object], tuple]] = [
        ("rms_norm", compute.rms_norm, (x, w, 1e-6)),
        ("fused_add_rms_norm", compute.fused_add_rms_norm, (x, res, w, 1e-6)),
        ("silu_and_mul", compute.silu_and_mul, (gu,)),
        ("qk_norm_rope_store_kv", att_ops.qk_norm_rope_store_kv,
         (qkv, hw, hw, cos_sin, pos, cache, slots, h, kv, d, 1e-6)),
    ]
    rows = []
    with torch.inference_mode():
        for name, entry, args in cases:
            impl = implementation(name, device)
            rows.append((name, call_cost_us(entry, args, device, iters), call_cost_us(impl, args, device, iters)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input", type=int, default=None, help="tokens per sequence (default 1024; 16 on CPU)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="also print the torch profiler's top ops by self CPU")
    ap.add_argument("--rows", type=int, default=25)
    args, overrides = ap.parse_known_args()
    cuda = torch.cuda.is_available()
    input_len = args.input or (1024 if cuda else 16)
    cfg = load_config(overrides if cuda else CPU_DEFAULTS + overrides, config_name="bench")
    cfg.bench.batch = [args.batch]
    cfg.bench.input_len = input_len
    cfg.bench.output_len = 1
    cfg = bench_config(cfg)

    probe_device = torch.device("cuda" if cuda and cfg.device.value != "cpu" else "cpu")
    loop_before, launch_before = python_loop_us(), launch_us(probe_device)
    t0 = time.perf_counter()
    runner = build_runner(cfg)
    print(f"[prefill_overhead] {type(runner).__name__} on {runner.device} ({runner.dtype}), built in "
          f"{time.perf_counter() - t0:.1f} s; backend {type(runner.backend).__name__}")
    layers = len(runner.attention_layers)
    rng = random.Random(0)
    for _ in range(args.warmup):
        time_steps(runner, [prefill_step(runner, args.batch, input_len, rng)])
    steps = [prefill_step(runner, args.batch, input_len, rng) for _ in range(args.iters)]

    loop_after, launch_after = python_loop_us(), launch_us(probe_device)
    gc_timer = GcTimer()
    gc.callbacks.append(gc_timer)
    threads_before = thread_cpu_seconds()
    wall0 = time.perf_counter()
    t = time_steps(runner, steps)
    wall = time.perf_counter() - wall0
    threads_after = thread_cpu_seconds()
    gc.callbacks.remove(gc_timer)

    print(f"prefill batch {args.batch} x {input_len} tokens, {layers} layers, median of {args.iters}:")
    print(f"  step (prepare .. logits on host, synchronized): {median_us(t['step']) / 1e3:9.3f} ms")
    print(f"  prepare {median_us(t['prepare']):9.1f} us   plan {median_us(t['plan']):9.1f} us   "
          f"logits (host) {median_us(t['logits_host']):9.1f} us")
    fwd = median_us(t["forward_host"])
    print(f"  forward, host time: {fwd / 1e3:9.3f} ms = {fwd / layers:8.1f} us per layer")
    if t["gpu"]:
        gpu = median_us(t["gpu"])
        print(f"  forward, GPU time:  {gpu / 1e3:9.3f} ms = {gpu / layers:8.1f} us per layer "
              f"({'host-bound' if fwd > gpu else 'GPU-bound'})")
    main_tid = threading_main_tid()
    busy = []
    for tid, (name, cpu) in threads_after.items():
        delta = cpu - threads_before.get(tid, (name, 0.0))[1]
        if tid != main_tid and delta > 0.01:
            busy.append(f"{name}[{tid}] {delta * 1e3:.0f} ms")
    main_cpu = threads_after.get(main_tid, ("", 0.0))[1] - threads_before.get(main_tid, ("", 0.0))[1]
    print(f"  timed steps: wall {wall * 1e3:.1f} ms, main thread CPU {main_cpu * 1e3:.0f} ms; "
          f"other threads: {', '.join(busy) or 'idle'}")
    print(f"  garbage collector: {gc_timer.seconds * 1e3:.2f} ms in {gc_timer.collections} collections "
          f"(gen 0/1/2); Python threads: {', '.join(t.name for t in threading.enumerate())}")
    print(f"  process state: {process_state()}")
    print(f"  before / after building the runner: pure-Python loop {loop_before:.0f} / {loop_after:.0f} us, "
          f"one torch kernel launch {launch_before:.2f} / {launch_after:.2f} us")

    print("one op call, host time (us): Python entry point vs implementation called directly")
    for name, entry, impl in op_call_costs(runner.device, runner.dtype):
        print(f"  {name:24s} {entry:8.2f} {impl:8.2f}   dispatch {entry - impl:7.2f}")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        step = prefill_step(runner, args.batch, input_len, rng)
        with profile(activities=acts) as prof:
            time_steps(runner, [step])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


def threading_main_tid() -> int:
    return threading.main_thread().native_id or os.getpid()


if __name__ == "__main__":
    main()
