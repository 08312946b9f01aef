"""The `xrt` operator namespace: one `torch.library.Library` that defines every op from its schema, with
a default implementation for every device (the plain-torch reference), per-device overrides (the CUDA
kernels) and a fake implementation for tracing.

Why not `torch.library.custom_op`: its Python layers (argument checks, mutation bookkeeping, a dynamo
guard around every kernel) cost 5-75 us per call on the host, more than the kernels they launch at batch
1; defined here the ops cost about 2 us of dispatch. The op names and schemas are the same, so
`torch.ops.xrt.<name>`, `torch.library.register_kernel("xrt::<name>", ...)` and `torch.library.opcheck`
work on them as before."""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIB = torch.library.Library("xrt", "DEF")
# What each op runs per dispatch key, for callers that want to time or call an implementation directly.
_IMPLS: dict[tuple[str, str], Callable[..., object]] = {}
DEFAULT_KEY = "CompositeExplicitAutograd"


def define(
    name: str, schema: str, default: Callable[..., object], fake: Callable[..., object]
) -> torch._ops.OpOverload:
    """Define `xrt::<name><schema>` with `default` for every device and `fake` for fake tensors; returns
    the op's overload, the cheapest thing to call."""
    _LIB.define(name + schema)
    _LIB.impl(name, default, DEFAULT_KEY)
    _IMPLS[(name, DEFAULT_KEY)] = default
    torch.library.register_fake(f"xrt::{name}", fake, lib=_LIB)
    return getattr(torch.ops.xrt, name).default


def register_device_impl(name: str, device_type: str, fn: Callable[..., object]) -> None:
    """Run `fn` for `xrt::<name>` when its tensors are on `device_type` ("cuda")."""
    key = device_type.upper()
    _LIB.impl(name, fn, key)
    _IMPLS[(name, key)] = fn


def implementation(name: str, device: torch.device | str) -> Callable[..., object]:
    """The function `xrt::<name>` runs for tensors on `device` (registered here)."""
    key = torch.device(device).type.upper()
    return _IMPLS.get((name, key)) or _IMPLS[(name, DEFAULT_KEY)]
