"""Shared set-up of the test_*_interpret.py files: Triton kernels run on CPU under TRITON_INTERPRET=1 through
the check functions of their *_gpu.py counterparts, on shapes small enough for the interpreter."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch


class Interpreter:
    """For one test module: skips it on CUDA machines (its *_gpu.py file runs the compiled kernels) or
    without triton, switches triton to its interpreter when triton is not imported yet, and loads the check
    functions of tests/<gpu_test> (a path under tests/, e.g. "kernels/test_gemv_gpu.py").

    triton.jit picks the interpreter at decoration time, so TRITON_INTERPRET must be set before triton is first
    imported. When another test module imported it first, `in_process` tests skip and the module's
    `test_in_subprocess` (marked `subprocess_only`) reruns the whole file in a fresh interpreter process."""

    def __init__(self, gpu_test: str) -> None:
        if torch.cuda.is_available():
            pytest.skip(f"CUDA present: tests/{gpu_test} covers the compiled kernels", allow_module_level=True)
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed", allow_module_level=True)
        self.active = "triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") == "1"
        if self.active:
            os.environ["TRITON_INTERPRET"] = "1"
        self.in_process = pytest.mark.skipif(not self.active, reason="triton already imported; run by "
                                             "test_in_subprocess")
        self.subprocess_only = pytest.mark.skipif(self.active, reason="runs in process")
        path = Path(__file__).parent / gpu_test
        spec = importlib.util.spec_from_file_location(f"xrt_checks_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        self.checks: ModuleType = importlib.util.module_from_spec(spec)
        # Registered first: the dataclass decorator looks its module up in sys.modules.
        sys.modules[spec.name] = self.checks
        spec.loader.exec_module(self.checks)

    @staticmethod
    def rerun(test_file: str) -> None:
        """Run test_file's tests in a fresh process with the interpreter on; fail with their output."""
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                                capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"})
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
