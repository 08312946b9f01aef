"""Tensor-parallel rank, size and process groups. It lives at the ops level because the
collective ops need the group; layers read rank and size from here to shard their weights.
Default: one rank, no group. `xrt.distributed` sets the state of a tensor-parallel run (`set_tp`) before
the runner is built and makes it current around each of its calls (`swap_tp`), so a one-rank runner in
the same process (tests, a second `LLM`) still sees one rank."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class TPState:
    rank: int
    size: int
    group: dist.ProcessGroup | None  # the model's collectives (NCCL on CUDA, gloo on CPU)
    # Host-side collectives (agreeing on the KV page count): a gloo group, the model's group when that is gloo.
    cpu_group: dist.ProcessGroup | None = None


SINGLE = TPState(rank=0, size=1, group=None)
_STATE = SINGLE


def tp_rank() -> int:
    return _STATE.rank


def tp_size() -> int:
    return _STATE.size


def tp_group() -> dist.ProcessGroup | None:
    return _STATE.group


def cpu_group() -> dist.ProcessGroup | None:
    return _STATE.cpu_group


def current_tp() -> TPState:
    return _STATE


def swap_tp(state: TPState) -> TPState:
    """Make `state` current; returns the one it replaces (a tensor-parallel runner restores it after a call)."""
    global _STATE
    previous, _STATE = _STATE, state
    return previous


def set_tp(
    rank: int, size: int, group: dist.ProcessGroup | None = None, cpu: dist.ProcessGroup | None = None
) -> TPState:
    if not 0 <= rank < size:
        raise ValueError(f"tensor-parallel rank must be in [0, {size}), got {rank}")
    state = TPState(rank=rank, size=size, group=group, cpu_group=cpu)
    swap_tp(state)
    return state


def init_tp(size: int) -> None:
    """Single rank for size 1. Otherwise the state `xrt.distributed` set for this run, or, when the caller
    initialised torch.distributed itself, every rank of its default group as one TP rank."""
    if size == 1:
        swap_tp(SINGLE)
        return
    if _STATE.size == size and _STATE.group is not None:
        return
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"parallel.tp: tp={size} needs its ranks started (xrt.distributed.factory.build_runner does, as "
            "LLM(cfg) and the CLI do)"
        )
    world = dist.get_world_size()
    if world != size:
        raise ValueError(f"parallel.tp: must equal the torch.distributed world size {world}, got {size}")
    gloo = dist.get_backend() == "gloo"
    set_tp(dist.get_rank(), size, dist.group.WORLD, dist.group.WORLD if gloo else dist.new_group(backend="gloo"))
