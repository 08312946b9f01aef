"""Tensor-parallel collectives as `xrt::` ops (`xrt.ops.registry`) over the group of
`xrt.ops.parallel_state`; identity at one rank. Ops, so that a decode CUDA graph captures them and each
rank replays its own graph. `min_over_ranks` and `sum_over_ranks` are host-side helpers (not ops) over the CPU
group."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from xrt.ops.parallel_state import cpu_group, tp_group, tp_size
from xrt.ops.registry import op


@op("(Tensor(a0!) x) -> ()")
def all_reduce_(x: torch.Tensor) -> None:
    """Sum x over the tensor-parallel group, in place."""
    if tp_size() > 1:
        dist.all_reduce(x, group=tp_group())


def _all_gather_fake(x: torch.Tensor, dim: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= tp_size()
    return x.new_empty(shape)


@op("(Tensor x, SymInt dim) -> Tensor", _all_gather_fake)
def all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x of every tensor-parallel rank, concatenated along dim (a copy at one rank)."""
    size = tp_size()
    if size == 1:
        return x.clone()  # an op may not return an alias of its input
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=tp_group())
    return torch.cat(parts, dim=dim)


def min_over_ranks(value: int) -> int:
    """The smallest `value` of every tensor-parallel rank (each rank sizes its own KV cache; all must hold the
    same pages). `value` at one rank."""
    if tp_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=cpu_group())
    return int(t.item())


def sum_over_ranks(values: Sequence[float]) -> list[float]:
    """Each of `values` summed over the tensor-parallel ranks (every rank passes as many); `values` at one rank."""
    if tp_size() == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=cpu_group())
    return t.tolist()
