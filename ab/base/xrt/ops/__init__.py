"""xrt's custom ops (`torch.ops.xrt.*`). Importing this package declares every op with its reference
implementation (`xrt.ops.reference`, `xrt.ops.collectives`), then registers the CUDA implementations
(`xrt.ops.cuda_impls`) when CUDA is present."""

from __future__ import annotations

import importlib

import torch

from xrt.ops import collectives, reference  # noqa: F401  (declare the ops)

if torch.cuda.is_available():
    importlib.import_module("xrt.ops.cuda_impls")
