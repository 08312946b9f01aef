"""Tensor-parallel collectives as `xrt::` ops (`xrt.ops.registry`) over the group of
`xrt.ops.parallel_state`; identity at one rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from xrt.ops.parallel_state import tp_group, tp_size
from xrt.ops.registry import define


def _all_reduce_impl(x: torch.Tensor) -> None:
    if tp_size() > 1:
        dist.all_reduce(x, group=tp_group())


def _all_gather_impl(x: torch.Tensor, dim: int) -> torch.Tensor:
    size = tp_size()
    if size == 1:
        return x.clone()  # an op may not return an alias of its input
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=tp_group())
    return torch.cat(parts, dim=dim)


def _all_reduce_fake(x: torch.Tensor) -> None:
    return None


def _all_gather_fake(x: torch.Tensor, dim: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= tp_size()
    return x.new_empty(shape)


_ALL_REDUCE = define("all_reduce_", "(Tensor(a0!) x) -> ()", _all_reduce_impl, _all_reduce_fake)
_ALL_GATHER = define("all_gather", "(Tensor x, SymInt dim) -> Tensor", _all_gather_impl, _all_gather_fake)


def all_reduce_(x: torch.Tensor) -> None:
    """Sum x over the tensor-parallel group, in place."""
    _ALL_REDUCE(x)


def all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x of every tensor-parallel rank, concatenated along dim (a copy at one rank)."""
    return _ALL_GATHER(x, dim)
