"""GPU-only tests: every test here takes `device` (or checks CUDA itself) and is skipped without CUDA (and Triton).

`slow` marks what only the full run needs: `pytest -m "not slow" tests/gpu` is the smoke subset (README.md)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: full GPU run only (more shapes, dtypes and batch sizes, extra FlashInfer JIT modules, the 0.6B "
        "model); `-m 'not slow'` keeps one or two cases of everything",
    )


def _flashinfer_cache() -> str:
    """The FlashInfer JIT cache the run starts from. ninja rebuilds a module whose inputs are newer than its
    objects: reinstalling the flashinfer wheel (new header mtimes) makes every cached module cost its full compile
    again, ~10-95 s each (README.md)."""
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
    modules = list(base.glob("*/*/cached_ops/*/*.so")) if base.is_dir() else []
    line = f"FlashInfer JIT cache {base}: {len(modules)} compiled modules"
    spec = importlib.util.find_spec("flashinfer")
    if modules and spec is not None and spec.submodule_search_locations:
        headers = Path(list(spec.submodule_search_locations)[0]) / "data" / "include"
        newest = max((f.stat().st_mtime for f in headers.rglob("*.cuh")), default=0.0)
        stale = sum(1 for m in modules if m.stat().st_mtime < newest)
        if stale:
            line += f", {stale} older than the installed flashinfer headers: ninja will rebuild them"
    return line


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which JIT caches the run starts from: timings are only comparable between runs that start alike."""
    if not torch.cuda.is_available():
        return []
    triton = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    kernels = sum(1 for _ in triton.rglob("*.cubin")) if triton.is_dir() else 0
    return [_flashinfer_cache(), f"Triton cache {triton}: {kernels} compiled kernels"]


@pytest.fixture
def device() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    pytest.importorskip("triton")
    return torch.device("cuda")
