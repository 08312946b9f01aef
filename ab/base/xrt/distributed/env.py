"""Whether torchrun (or any launcher setting its variables) started this process, and as which rank.
No torch import: the CLI asks before it loads anything."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int
    world_size: int
    local_rank: int


def torchrun_env() -> TorchrunEnv | None:
    """RANK / WORLD_SIZE / LOCAL_RANK as torchrun sets them; None when they are absent (xrt spawns its ranks)."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    return TorchrunEnv(int(rank), int(world), int(os.environ.get("LOCAL_RANK", rank)))
