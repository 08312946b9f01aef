"""Which device and dtype a run uses, from the config."""

from __future__ import annotations

import torch

from xrt.config import Device, DType, XrtConfig

DTYPES = {DType.FLOAT32: torch.float32, DType.BFLOAT16: torch.bfloat16, DType.FLOAT16: torch.float16}


def resolve_device(cfg: XrtConfig) -> torch.device:
    """auto: cuda when present, else cpu."""
    cuda = torch.cuda.is_available()
    if cfg.device is Device.CUDA and not cuda:
        raise ValueError("device: cuda requested but torch.cuda.is_available() is false")
    if cfg.device is Device.CPU or not cuda:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def resolve_dtype(cfg: XrtConfig, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA, float32 on CPU."""
    if cfg.model.dtype is DType.AUTO:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[cfg.model.dtype]
