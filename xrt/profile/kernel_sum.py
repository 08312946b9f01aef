"""Torch-profiler summaries: CUDA kernels (and memcpy / memset) summed by name per step, and the profiler's
own top-ops table."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from xrt.bench.markdown import md_table


def activities(device: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def kernel_table(prof: profile, steps: int, rows: int) -> list[str]:
    """Device time per step by kernel name, with the total. "Exposed" is the time each kernel adds to the device's
    busy span: its end past the latest end of the kernels that started before it, the gap before it included.
    Kernels overlapping under PDL each count their whole duration in us/step (waits included) but only the span
    they extend in exposed, which sums to the steps' GPU time: where a step's time goes. Largest exposed first."""
    kernels = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: (e.time_range.start, e.time_range.end))
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    horizon = kernels[0].time_range.start if kernels else 0.0  # the first kernel exposes its own duration
    for ev in kernels:
        start, end = ev.time_range.start, ev.time_range.end
        entry = per_name[ev.name[:90]]
        entry[0] += end - start
        entry[1] += max(0.0, end - horizon)
        entry[2] += 1
        horizon = max(horizon, end)
    total = sum(v[0] for v in per_name.values()) / steps
    exposed = sum(v[1] for v in per_name.values()) / steps
    top = sorted(per_name.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))[:rows]
    cells = [[f"{us / steps:.1f}", f"{exp / steps:.1f}", f"{calls / steps:.1f}", f"{us / max(calls, 1):.2f}",
              f"`{name}`"] for name, (us, exp, calls) in top]
    return [f"total {total:.1f} us per step, {exposed:.1f} us exposed, over {steps} step(s)", "",
            *md_table(["us/step", "exposed us/step", "calls/step", "us/call", "kernel"], cells,
                      [True, True, True, True, False])]


def top_ops(prof: profile, sort_by: str, rows: int) -> str:
    return "```\n" + prof.key_averages().table(sort_by=sort_by, row_limit=rows) + "\n```"
