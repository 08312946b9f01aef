"""The `xrt` operator namespace: one `torch.library.Library` in which each op is declared once, by the
`@op(schema)` decorator on its plain-torch reference function. The reference runs on every device; a
device registers a faster implementation by op name (`register_device_impl`, `register_kernels`) without
restating the signature; a fake implementation serves tracing.

Why not `torch.library.custom_op`: its Python layers (argument checks, mutation bookkeeping, a dynamo
guard around every kernel) cost 5-75 us per call on the host, more than the kernels they launch at batch
1; defined here the ops cost about 2 us of dispatch (`python -m xrt profile profile.mode=step` prints the
figure per op). The op names and schemas are the same, so `torch.ops.xrt.<name>`,
`torch.library.register_kernel("xrt::<name>", ...)` and `torch.library.opcheck` work on them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TypeVar

import torch

_LIB = torch.library.Library("xrt", "DEF")
# What each op runs per dispatch key, for callers that want to time or call an implementation directly.
_IMPLS: dict[tuple[str, str], Callable[..., object]] = {}
DEFAULT_KEY = "CompositeExplicitAutograd"
F = TypeVar("F", bound=Callable[..., object])


def _no_output(*args: object) -> None:
    return None


def op(schema: str, fake: Callable[..., object] | None = None) -> Callable[[F], F]:
    """Declare `xrt::<function name><schema>` with the decorated function as its implementation on every
    device and `fake` for fake tensors (ops that return nothing need none). The function itself is returned
    unchanged: references call each other directly, never through the dispatcher (which would pick a CUDA
    kernel from inside the reference on CUDA tensors)."""

    def declare(fn: F) -> F:
        name = fn.__name__
        if fake is None and not schema.rstrip().endswith("-> ()"):
            raise TypeError(f"xrt::{name} returns a value and needs a fake implementation")
        _LIB.define(name + schema)
        _LIB.impl(name, fn, DEFAULT_KEY)
        _IMPLS[(name, DEFAULT_KEY)] = fn
        torch.library.register_fake(f"xrt::{name}", fake or _no_output, lib=_LIB)
        return fn

    return declare


def register_device_impl(name: str, device_type: str, fn: Callable[..., object]) -> None:
    """Run `fn` for `xrt::<name>` when its tensors are on `device_type` ("cuda"). Straight into the
    dispatch table: torch.library.register_kernel would wrap every call in a dynamo guard (microseconds
    per launch)."""
    key = device_type.upper()
    _LIB.impl(name, fn, key)
    _IMPLS[(name, key)] = fn


_MODULES: dict[str, ModuleType] = {}


def _module(path: str) -> ModuleType:
    module = _MODULES.get(path)
    if module is None:
        module = _MODULES[path] = importlib.import_module(path)
    return module


def lazy_function(module: str, function: str) -> Callable[..., object]:
    """A forwarder to `module.function`, imported on its first call (so registering a Triton kernel does not
    import triton) and looked up on every call (so a test can replace the function on its module)."""

    def forward(*args: object) -> object:
        return getattr(_module(module), function)(*args)

    forward.__name__ = forward.__qualname__ = function
    return forward


def register_kernels(device_type: str, package: str, kernels: dict[str, str]) -> None:
    """For each op name -> "module.function" (relative to `package`): run that function for the op on
    `device_type`, with the op's arguments as they are."""
    for name, target in kernels.items():
        module, _, function = target.rpartition(".")
        register_device_impl(name, device_type, lazy_function(f"{package}.{module}", function))


def implementation(name: str, device: torch.device | str) -> Callable[..., object]:
    """The function `xrt::<name>` runs for tensors on `device` (registered here)."""
    key = torch.device(device).type.upper()
    return _IMPLS.get((name, key)) or _IMPLS[(name, DEFAULT_KEY)]
