"""How a checkpoint tensor lands in a parameter: each parameter carries a `weight_loader`
that checks the full (unsharded) shape, takes this rank's slice and copies it in."""

from __future__ import annotations

import torch
from torch import nn


class WeightShapeError(ValueError):
    def __init__(self, expected: tuple[int, ...], got: tuple[int, ...]) -> None:
        super().__init__(f"expected shape {expected}, got {got}")
        self.expected = expected
        self.got = got


def check_shape(loaded: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise WeightShapeError(tuple(expected), tuple(loaded.shape))


def new_param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str | None) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    check_shape(loaded, tuple(param.shape))
    param.data.copy_(loaded)


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what}={numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator
