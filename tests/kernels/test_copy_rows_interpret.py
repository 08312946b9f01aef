"""The bounded-grid row copy on CPU under TRITON_INTERPRET=1, through the checks of
tests/kernels/test_copy_rows_gpu.py. Skipped without triton and on CUDA machines (the *_gpu.py file runs the
compiled kernel)."""

from __future__ import annotations

import torch
from interpret_support import Interpreter

INTERPRETER = Interpreter("kernels/test_copy_rows_gpu.py")
checks = INTERPRETER.checks
in_process = INTERPRETER.in_process
CPU = torch.device("cpu")


@in_process
def test_copies() -> None:
    checks.check_copies(CPU)


@in_process
def test_argument_errors() -> None:
    checks.check_argument_errors(CPU)


@INTERPRETER.subprocess_only
def test_in_subprocess() -> None:
    INTERPRETER.rerun(__file__)
