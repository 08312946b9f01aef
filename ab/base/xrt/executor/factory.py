"""Build one process's model runner for the config (the engine goes through `xrt.distributed.factory`, which
builds a tensor-parallel runner over one of these per rank when parallel.tp > 1)."""

from __future__ import annotations

from xrt.config import XrtConfig
from xrt.executor.runner import ModelRunner


def build_runner(cfg: XrtConfig) -> ModelRunner:
    """executor.kind=cudagraph raises "executor.kind: cudagraph needs a CUDA device" without one."""
    return ModelRunner(cfg)
