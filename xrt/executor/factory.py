"""Pick the model runner the config asks for."""

from __future__ import annotations

import torch

from xrt.config import Device, ExecutorKind, XrtConfig
from xrt.executor.runner import ModelRunner


def build_runner(cfg: XrtConfig) -> ModelRunner:
    if cfg.executor.kind is ExecutorKind.EAGER:
        return ModelRunner(cfg)
    if cfg.device is Device.CPU or not torch.cuda.is_available():
        raise ValueError("executor.kind: cudagraph needs a CUDA device")
    from xrt.executor.cudagraph import CudaGraphRunner

    return CudaGraphRunner(cfg)
