"""Compiling xrt's Triton kernels for the H200 (sm_90) on a machine without a GPU: Triton's code generator and its
bundled ptxas, nothing launched. `launches(fn)` runs a kernel wrapper on CPU tensors with every Triton launch
recorded instead of run (a wrapper's checks and its choice of grid, constexprs and warps are the real ones);
`ptxas_report` compiles a recorded launch as a GPU would (PDL on where the kernel takes it) and returns what ptxas
says of it; `spill_bytes` reads the spill stores out of that. Used by tests/kernels/test_*_sm90.py, each through a
`Compiler`.

triton.jit decides at decoration time whether a kernel is compiled or interpreted: in a session where a
*_interpret.py file switched the interpreter on first (tests/interpret_support.py), the kernels here are interpreted
functions, so `in_process` tests skip and the file's `test_in_subprocess` reruns it in a fresh process without the
interpreter."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch


class Compiler:
    """For one test module: skips it on CUDA machines (the GPU tests launch the kernels) or without triton's CUDA
    toolchain, and marks its tests to run in this process or, under the interpreter, in a fresh one."""

    def __init__(self, gpu_test: str) -> None:
        if torch.cuda.is_available():
            pytest.skip(f"CUDA present: tests/{gpu_test} launches the kernels", allow_module_level=True)
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed", allow_module_level=True)
        if not os.access(ptxas(), os.X_OK):
            pytest.skip("triton's bundled ptxas is missing", allow_module_level=True)
        self.active = os.environ.get("TRITON_INTERPRET") != "1"
        self.in_process = pytest.mark.skipif(not self.active, reason="Triton interprets kernels in this session: "
                                             "run by test_in_subprocess")
        self.subprocess_only = pytest.mark.skipif(self.active, reason="runs in process")

    def cases(self, cases: list[Any]) -> list[Any]:
        """A parametrization's cases, none where they run in the fresh process (one skip, not one per case)."""
        return cases if self.active else []

    @staticmethod
    def rerun(test_file: str) -> None:
        """Run test_file's tests in a fresh process with the interpreter off; fail with their output."""
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                                capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def ptxas() -> str:
    spec = importlib.util.find_spec("triton")
    assert spec is not None and spec.origin is not None
    return os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", "ptxas")


@dataclass
class Launch:
    kernel: Any  # triton's JITFunction
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
    from triton.runtime.jit import JITFunction

    recorded: list[Launch] = []
    original = JITFunction.run

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
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
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

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
    done = subprocess.run([ptxas(), "-v", "-arch=sm_90a", ptx, "-o", os.devnull], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def spill_bytes(report: str) -> int:
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills, f"no spill line in ptxas' report: {report}"
    return max(spills)
