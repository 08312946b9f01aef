"""Process state that slows every launch of the main thread: other threads' CPU time, the garbage collector,
trace hooks and torch modes, a fixed Python loop and one kernel launch timed before and after building the
runner (slower after: the process's state, e.g. a busy thread, slows the CPU or the driver for everything);
and the host cost of one xrt op call through its entry point against its implementation called directly."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable

import torch

from xrt.profile.runner_parts import sync


def thread_cpu_seconds() -> dict[int, tuple[str, float]]:
    """tid -> (name, user + system CPU seconds) from /proc (Linux); empty elsewhere."""
    out: dict[int, tuple[str, float]] = {}
    base = "/proc/self/task"
    if not os.path.isdir(base):
        return out
    tick = os.sysconf("SC_CLK_TCK")
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


def busy_threads(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> str:
    """CPU time of the main thread and of every other thread that used more than 10 ms in between."""
    main = threading.main_thread().native_id or os.getpid()
    busy = [f"{name}[{tid}] {(cpu - before.get(tid, (name, 0.0))[1]) * 1e3:.0f} ms"
            for tid, (name, cpu) in after.items() if tid != main and cpu - before.get(tid, (name, 0.0))[1] > 0.01]
    main_ms = (after.get(main, ("", 0.0))[1] - before.get(main, ("", 0.0))[1]) * 1e3
    return f"main thread CPU {main_ms:.0f} ms; other threads: {', '.join(busy) or 'idle'}"


class GcTimer:
    """Time spent in Python's garbage collector while installed (gc.callbacks)."""

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
    """A fixed pure-Python workload (best of 5)."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        acc = 0
        for i in range(100_000):
            acc += i & 7
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


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


def launch_us(device: torch.device) -> float:
    """Host time of one small torch kernel launch; 0 without CUDA."""
    if device.type != "cuda":
        return 0.0
    x = torch.zeros(16, device=device)
    return call_cost_us(x.add_, (1.0,), device, 1000)


def process_state() -> str:
    return (f"sys trace {sys.gettrace() is not None}, sys profile {sys.getprofile() is not None}, "
            f"torch function mode {torch._C._is_torch_function_mode_enabled()}, "
            f"dispatch modes {torch._C._len_torch_dispatch_stack()}, gc enabled {gc.isenabled()} "
            f"thresholds {gc.get_threshold()} tracked objects {len(gc.get_objects())}")


def op_call_costs(device: torch.device, dtype: torch.dtype, hidden: int, inter: int, heads: int, kv_heads: int,
                  head_dim: int, page: int, iters: int = 2000) -> list[tuple[str, float, float]]:
    """(op, us per call through xrt.ops' entry point, us per call of its implementation), one token at the
    model's widths; the difference is what dispatch adds to every call."""
    import xrt.ops  # noqa: F401  (registers the ops)
    from xrt.ops.registry import implementation

    ops = torch.ops.xrt

    kw = {"device": device, "dtype": dtype}
    x, res, w = torch.randn(1, hidden, **kw), torch.randn(1, hidden, **kw), torch.ones(hidden, **kw)
    qkv, hw = torch.randn(1, (heads + 2 * kv_heads) * head_dim, **kw), torch.ones(head_dim, **kw)
    cos_sin = torch.zeros(16, head_dim, device=device, dtype=torch.float32)
    pos = torch.zeros(1, dtype=torch.int64, device=device)
    cache = torch.zeros(2, 2, page, kv_heads, head_dim, **kw)
    slots = torch.zeros(1, dtype=torch.int64, device=device)
    cases: list[tuple[str, Callable[..., object], tuple]] = [
        ("rms_norm", ops.rms_norm, (x, w, 1e-6)),
        ("fused_add_rms_norm", ops.fused_add_rms_norm, (x, res, w, 1e-6)),
        ("silu_and_mul", ops.silu_and_mul, (torch.randn(1, 2 * inter, **kw),)),
        ("qk_norm_rope_store_kv", ops.qk_norm_rope_store_kv,
         (qkv, hw, hw, cos_sin, pos, cache, slots, heads, kv_heads, head_dim, 1e-6)),
    ]
    with torch.inference_mode():
        return [(name, call_cost_us(entry, args, device, iters),
                 call_cost_us(implementation(name, device), args, device, iters)) for name, entry, args in cases]
