"""What a command checks of this machine before it loads a model, and what `config validate` checks too, so validate
says ok only to what `run` would start: `runtime_check` (CUDA, devices, tensor-parallel ranks), the checkpoint
(`model.path`, or where the tiny one is made), the KV tiers (host memory for cache.l1, NIXL's L2 backend and its
parameters), then the command's own paths (`xrt.cli.paths.CHECKS`). Warnings: what would run, but not as asked
(an L2 directory that cannot be made: L2 would store nothing)."""

from __future__ import annotations

import os

from xrt.config import XrtConfig
from xrt.reflect import Problem


def machine_problems(cfg: XrtConfig) -> list[Problem]:
    from xrt.config import runtime_check
    from xrt.engine.precheck import checkpoint_problems
    from xrt.kvstore.preflight import tier_problems

    return runtime_check(cfg) + checkpoint_problems(cfg) + tier_problems(cfg, ranks_here(cfg))


def command_problems(cfg: XrtConfig, command: str) -> list[Problem]:
    """machine_problems, then the paths `command` writes."""
    from xrt.cli.paths import CHECKS

    return machine_problems(cfg) + CHECKS.get(command, lambda cfg: [])(cfg)


def machine_warnings(cfg: XrtConfig) -> list[str]:
    from xrt.kvstore.preflight import l2_path_warning

    warning = l2_path_warning(cfg)
    return [warning] if warning else []


def ranks_here(cfg: XrtConfig) -> int:
    """The ranks that run on this host: all of parallel.tp when xrt spawns them, torchrun's LOCAL_WORLD_SIZE."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        local = os.environ.get("LOCAL_WORLD_SIZE", "1")
        return int(local) if local.isdigit() else 1
    return cfg.parallel.tp


__all__ = ["command_problems", "machine_problems", "machine_warnings", "ranks_here"]
