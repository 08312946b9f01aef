"""Tensor-parallel collectives as `xrt::` custom ops over the group of `xrt.ops.parallel_state`;
identity at one rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from xrt.ops.parallel_state import tp_group, tp_size


@torch.library.custom_op("xrt::all_reduce_", mutates_args=("x",))
def all_reduce_(x: torch.Tensor) -> None:
    if tp_size() > 1:
        dist.all_reduce(x, group=tp_group())


@all_reduce_.register_fake
def _(x: torch.Tensor) -> None:
    return None


@torch.library.custom_op("xrt::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    size = tp_size()
    if size == 1:
        return x.clone()  # a custom op may not return an alias of its input
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=tp_group())
    return torch.cat(parts, dim=dim)


@all_gather.register_fake
def _(x: torch.Tensor, dim: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= tp_size()
    return x.new_empty(shape)
