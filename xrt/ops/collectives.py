"""Tensor-parallel collectives as `xrt::` ops (`xrt.ops.registry`) over the process group named by their
`group_name` argument (`TPState.group_name`), resolved inside the op as torch's functional collectives do;
identity without a group (""). Ops, so that a decode CUDA graph captures them and each rank replays its own
graph. `min_over_ranks`, `mins_over_ranks` and `sum_over_ranks` are host-side helpers (not ops) over a
`TPState`'s CPU group."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from xrt.ops.parallel_state import TPState
from xrt.ops.registry import op


@op("(Tensor(a0!) x, str group_name) -> ()")
def all_reduce_(x: torch.Tensor, group_name: str) -> None:
    """Sum x over the group, in place."""
    if group_name:
        dist.all_reduce(x, group=_resolve_process_group(group_name))


def _all_gather_fake(x: torch.Tensor, dim: int, group_size: int, group_name: str) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= group_size
    return x.new_empty(shape)


@op("(Tensor x, SymInt dim, SymInt group_size, str group_name) -> Tensor", _all_gather_fake)
def all_gather(x: torch.Tensor, dim: int, group_size: int, group_name: str) -> torch.Tensor:
    """x of every rank of the group (group_size of them), concatenated along dim (a copy at one rank)."""
    if group_size == 1:
        return x.clone()  # an op may not return an alias of its input
    parts = [torch.empty_like(x) for _ in range(group_size)]
    dist.all_gather(parts, x.contiguous(), group=_resolve_process_group(group_name))
    return torch.cat(parts, dim=dim)


def min_over_ranks(value: int, tp: TPState) -> int:
    """The smallest `value` of every rank of `tp` (each rank sizes its own KV cache; all must hold the same
    pages). `value` at one rank."""
    return mins_over_ranks([value], tp)[0]


def mins_over_ranks(values: Sequence[int], tp: TPState) -> list[int]:
    """Each of `values` at its smallest over the ranks of `tp` (every rank passes as many); `values` at one rank."""
    return _over_ranks(values, tp, torch.int64, dist.ReduceOp.MIN)


def sum_over_ranks(values: Sequence[float], tp: TPState) -> list[float]:
    """Each of `values` summed over the ranks of `tp` (every rank passes as many); `values` at one rank."""
    return _over_ranks(values, tp, torch.float64, dist.ReduceOp.SUM)


def _over_ranks(values: Sequence, tp: TPState, dtype: torch.dtype, op: dist.ReduceOp) -> list:
    if tp.size == 1:
        return list(values)
    t = torch.tensor(list(values), dtype=dtype)
    dist.all_reduce(t, op=op, group=tp.cpu_group)
    return t.tolist()
