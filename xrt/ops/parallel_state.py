"""Tensor-parallel rank, size and process group. It lives at the ops level because the
collective ops need the group; layers read rank and size from here to shard their weights.
Default: one rank, no group."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class TPState:
    rank: int
    size: int
    group: dist.ProcessGroup | None


_STATE = TPState(rank=0, size=1, group=None)


def tp_rank() -> int:
    return _STATE.rank


def tp_size() -> int:
    return _STATE.size


def tp_group() -> dist.ProcessGroup | None:
    return _STATE.group


def set_tp(rank: int, size: int, group: dist.ProcessGroup | None = None) -> None:
    global _STATE
    if not 0 <= rank < size:
        raise ValueError(f"tensor-parallel rank must be in [0, {size}), got {rank}")
    _STATE = TPState(rank=rank, size=size, group=group)


def init_tp(size: int) -> None:
    """Single rank for size 1; otherwise every rank of the initialised default group is one TP rank."""
    if size == 1:
        set_tp(0, 1, None)
        return
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"parallel.tp: tp={size} needs torch.distributed initialised (start workers with torchrun)")
    world = dist.get_world_size()
    if world != size:
        raise ValueError(f"parallel.tp: must equal the torch.distributed world size {world}, got {size}")
    set_tp(dist.get_rank(), size, dist.group.WORLD)
