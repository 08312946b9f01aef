"""xrt's custom ops (`torch.ops.xrt.*`). Importing this package registers every op with its
reference implementation, then the CUDA implementations when CUDA is present and they exist."""

from __future__ import annotations

import importlib
import importlib.util

import torch

from xrt.ops import attention, collectives, compute  # noqa: F401  (registers the ops)


def _register_cuda_impls() -> None:
    if torch.cuda.is_available() and importlib.util.find_spec("xrt.ops.cuda_impls") is not None:
        importlib.import_module("xrt.ops.cuda_impls")


_register_cuda_impls()
