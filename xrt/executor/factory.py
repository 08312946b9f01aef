"""Build the model runner the config asks for."""

from __future__ import annotations

from xrt.config import XrtConfig
from xrt.executor.runner import ModelRunner


def build_runner(cfg: XrtConfig) -> ModelRunner:
    """executor.kind=cudagraph raises "executor.kind: cudagraph needs a CUDA device" without one."""
    return ModelRunner(cfg)
