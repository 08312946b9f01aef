"""Run the profile mode the config selects; a setting this machine cannot profile raises BenchError (one line
naming the field)."""

from __future__ import annotations

import torch

from xrt.bench.latency import free_memory
from xrt.bench.setup import BenchError
from xrt.config import XrtConfig
from xrt.config.bench import ProfileMode
from xrt.profile.setup import Emit, require_cuda


def run_profile(cfg: XrtConfig, emit: Emit) -> None:
    if cfg.parallel.tp > 1:
        # The modes reach into one process's ModelRunner (runner_parts.py); profile one rank's shard instead.
        raise BenchError("parallel.tp: profile runs one process; use parallel.tp=1")
    try:
        _run_mode(cfg, emit)
    finally:
        # A mode's runner sits in reference cycles: without a collection its KV cache (most of the GPU, sized from
        # free memory) outlives the mode, and the next runner of this process finds no room. (Not resolve_device:
        # a device the machine lacks is the mode's error to report, not this cleanup's.)
        free_memory(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def _run_mode(cfg: XrtConfig, emit: Emit) -> None:
    mode = cfg.profile.mode
    if mode is ProfileMode.HOST:
        from xrt.profile.host import run_host

        run_host(cfg, emit)
    elif mode is ProfileMode.STEP:
        from xrt.profile.step import run_step

        run_step(cfg, emit)
    else:
        require_cuda(cfg)
        from xrt.profile.breakdown import run_breakdown

        run_breakdown(cfg, emit)
