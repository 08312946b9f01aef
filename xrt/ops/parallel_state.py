"""Tensor-parallel rank, size and process groups of one model: a frozen `TPState` that the runner builds
(`init_tp`) or is handed (`xrt.distributed`: a worker's, rank 0's) and passes to the model at construction. The
layers keep their rank and size to shard their weights, and pass the model group's name to the collective ops
(`xrt.ops.collectives`), which resolve it as torch's functional collectives do. Nothing is process-wide: two
runners in one process (tests, a second `LLM`) each keep their own."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class TPState:
    rank: int
    size: int
    group: dist.ProcessGroup | None = None  # the model's collectives (NCCL on CUDA, gloo on CPU)
    # Host-side collectives (agreeing on the KV page count): a gloo group, the model's group when that is gloo.
    cpu_group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank must be in [0, {self.size}), got {self.rank}")

    @property
    def group_name(self) -> str:
        """The model group's name, as the collective ops take it; "" without a group (one rank)."""
        return self.group.group_name if self.group is not None else ""


SINGLE = TPState(rank=0, size=1)


def init_tp(size: int, given: TPState | None = None) -> TPState:
    """The state of a runner of `size` (parallel.tp) ranks: `given` when the caller has one (xrt.distributed
    builds it for its ranks), SINGLE for one rank, else, when the caller initialised torch.distributed itself,
    every rank of its default group as one TP rank."""
    if given is not None:
        if given.size != size:
            raise ValueError(f"parallel.tp: {size} does not match the {given.size} ranks given")
        return given
    if size == 1:
        return SINGLE
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"parallel.tp: tp={size} needs its ranks started (xrt.distributed.factory.build_runner does, as "
            "LLM(cfg) and the CLI do)"
        )
    world = dist.get_world_size()
    if world != size:
        raise ValueError(f"parallel.tp: must equal the torch.distributed world size {world}, got {size}")
    world_group = dist.group.WORLD
    cpu = world_group if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return TPState(dist.get_rank(), size, world_group, cpu)
