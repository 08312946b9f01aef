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
    """Device time per step by kernel name, largest first, with the total."""
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        entry = per_name[ev.name[:90]]
        entry[0] += ev.device_time
        entry[1] += 1
    total = sum(v[0] for v in per_name.values()) / steps
    top = sorted(per_name.items(), key=lambda kv: -kv[1][0])[:rows]
    cells = [[f"{us / steps:.1f}", f"{calls / steps:.1f}", f"{us / max(calls, 1):.2f}", f"`{name}`"]
             for name, (us, calls) in top]
    return [f"total {total:.1f} us per step over {steps} step(s)", "",
            *md_table(["us/step", "calls/step", "us/call", "kernel"], cells, [True, True, True, False])]


def top_ops(prof: profile, sort_by: str, rows: int) -> str:
    return "```\n" + prof.key_averages().table(sort_by=sort_by, row_limit=rows) + "\n```"
