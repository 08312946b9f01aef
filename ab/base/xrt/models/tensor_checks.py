"""Checks on each checkpoint tensor as it loads: a floating-point dtype, and finite values."""

from __future__ import annotations

import torch

from xrt.models.errors import CheckpointError


def check_floating(file: str, name: str, tensor: torch.Tensor) -> None:
    """Every tensor a Qwen3 checkpoint holds is a float weight; an integer one (a quantized or mis-saved
    checkpoint) would otherwise be cast to float silently and run as garbage."""
    if not tensor.is_floating_point():
        dtype = str(tensor.dtype).removeprefix("torch.")
        raise CheckpointError(
            f"{file}: tensor {name} has dtype {dtype}, expected floating point (float32, bfloat16 or float16)"
        )


def check_finite(file: str, name: str, tensor: torch.Tensor) -> None:
    """Raise if `tensor` holds NaN or inf; every element counts (not a sample). One sum per tensor: any NaN or inf
    makes the sum non-finite, and on CPU a sum streams 20-25x faster than torch.isfinite(t).all() (which writes a
    bool tensor first). Only a non-finite sum (a bad tensor, or a finite one whose sum overflowed, e.g. large
    float16 weights) pays for the exact element-wise check. On CUDA the tensor is summed on the device: loading a
    Qwen3-0.6B-shaped bf16 checkpoint from page cache on an H200 went 234 -> 257 ms, 8 layers of the 8B shape
    (5.6 GB) 0.92 s either way; the CPU isfinite().all() would have added 0.55 s and 2.5 s."""
    if bool(torch.isfinite(tensor.sum())):
        return
    bad = ~torch.isfinite(tensor)
    count = int(bad.sum())
    if not count:
        return
    first = [int(i) for i in torch.nonzero(bad)[0]]
    where = f", the first at [{', '.join(map(str, first))}]" if first else ""
    raise CheckpointError(f"{file}: tensor {name} holds {count} NaN/inf value(s){where}; expected finite weights")
