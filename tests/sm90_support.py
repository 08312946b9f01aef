"""Compiling xrt's Triton kernels for the H200 (sm_90) on a machine without a GPU: Triton's code generator and its
bundled ptxas, nothing launched. `launches(fn)` runs a kernel wrapper on CPU tensors with every Triton launch
recorded instead of run (a wrapper's checks and its choice of grid, constexprs and warps are the real ones);
`ptxas_report` compiles a recorded launch as a GPU would (PDL on where the kernel takes it) and returns what ptxas
says of it; `spill_bytes` reads the spill stores out of that. Used by tests/kernels/test_*_sm90.py."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
HAVE_PTXAS = os.access(PTXAS, os.X_OK)


@dataclass
class Launch:
    kernel: JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]  # the constexprs and launch options passed by name

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def arg(self, name: str) -> Any:
        names = [p.name for p in self.kernel.params]
        return self.kwargs[name] if name in self.kwargs else self.args[names.index(name)]


def launches(fn: Callable[[], object]) -> list[Launch]:
    """The Triton launches fn() makes, recorded and not run."""
    recorded: list[Launch] = []
    original = JITFunction.run

    def record(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        recorded.append(Launch(self, args, kwargs))

    JITFunction.run = record  # type: ignore[method-assign]
    try:
        fn()
    finally:
        JITFunction.run = original  # type: ignore[method-assign]
    return recorded


def ptxas_report(launch: Launch, tmp: str) -> str:
    """ptxas -v's lines for the launch compiled for sm_90a as Triton's launcher would compile it (its own binder:
    the same specialization of the arguments, the same options), PDL on where the kernel takes it (a GPU launch
    asks for it; the CPU's never does)."""
    kernel = launch.kernel
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kwargs = {**launch.kwargs, **({"PDL": True} if "PDL" in launch.kwargs else {})}
    kwargs = {k: v for k, v in kwargs.items() if k != "launch_pdl"}
    kwargs["debug"] = False
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
    ptx = os.path.join(tmp, f"{launch.name}.ptx")
    with open(ptx, "w") as f:
        f.write(compiled.asm["ptx"])
    done = subprocess.run([PTXAS, "-v", "-arch=sm_90a", ptx, "-o", os.devnull], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def spill_bytes(report: str) -> int:
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills, f"no spill line in ptxas' report: {report}"
    return max(spills)
