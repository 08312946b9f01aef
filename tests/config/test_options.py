"""`apply_options`: the schema's behaviour switches reach the kernels and layers (no environment variables)."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from op_log import XrtOpLog

from xrt.config import ExecutorArgs, LogLevel, XrtConfig
from xrt.executor.options import apply_options
from xrt.kernels import settings as kernel_settings
from xrt.layers import linear as linear_layers


@pytest.fixture(autouse=True)
def restore_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's apply_options is undone afterwards (the switches are process-wide)."""
    monkeypatch.setattr(kernel_settings, "pdl_max_rows", kernel_settings.pdl_max_rows)
    monkeypatch.setattr(linear_layers, "SKINNY_ROWS", linear_layers.SKINNY_ROWS)
    xrt_logger = logging.getLogger("xrt")
    monkeypatch.setattr(xrt_logger, "level", xrt_logger.level)


def configured(**executor: object) -> XrtConfig:
    return XrtConfig(executor=ExecutorArgs(**executor))


def test_defaults_are_the_measured_values() -> None:
    apply_options(XrtConfig())
    assert kernel_settings.pdl_max_rows == 16
    assert linear_layers.SKINNY_ROWS == 8


def test_pdl_follows_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = pytest.importorskip("xrt.kernels.launch")
    # As on a Hopper GPU: the hardware and Triton support PDL, so only the config decides.
    monkeypatch.setattr(launch, "_pdl_on", lambda index: True)
    on_cuda = types.SimpleNamespace(device=torch.device("cuda", 0))
    apply_options(XrtConfig())
    assert launch.pdl(on_cuda, 1) and launch.pdl(on_cuda, 16) and not launch.pdl(on_cuda, 17)
    apply_options(configured(pdl_max_rows=32))
    assert launch.pdl(on_cuda, 17) and launch.pdl(on_cuda, 32) and not launch.pdl(on_cuda, 33)
    apply_options(configured(pdl=False))
    assert not launch.pdl(on_cuda, 1) and not launch.pdl(on_cuda, 0)
    # a later config turns it back on: nothing cached the old setting
    apply_options(XrtConfig())
    assert launch.pdl(on_cuda, 1)
    assert not launch.pdl(torch.zeros(1), 1)  # never on the CPU


class _LooksCuda(torch.Tensor):
    """A CPU tensor the layers take for a CUDA one (they route on `is_cuda`)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_skinny_rows_route_the_lm_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """ParallelLMHead reads the configured row limit (not a copy taken at import)."""
    from xrt.layers import embedding

    head = embedding.ParallelLMHead(16, 8, torch.float32, "cpu")
    hidden = torch.zeros(6, 8).as_subclass(_LooksCuda)
    log = XrtOpLog()
    with log:
        apply_options(XrtConfig())
        head.compute_logits(hidden)
        apply_options(configured(skinny_gemm_max_rows=4))
        head.compute_logits(hidden)
    assert [args[0].shape[0] for name, args in zip(log.calls, log.args, strict=True) if name == "linear"] == [6]


def test_log_level_is_applied() -> None:
    apply_options(XrtConfig(log_level=LogLevel.WARNING))
    assert logging.getLogger("xrt.executor.runner").getEffectiveLevel() == logging.WARNING
    apply_options(XrtConfig(log_level=LogLevel.DEBUG))
    assert logging.getLogger("xrt.executor.runner").isEnabledFor(logging.DEBUG)


def test_the_runner_applies_the_options() -> None:
    from xrt.config.compose import load_config
    from xrt.executor.runner import ModelRunner

    ModelRunner(load_config(["device=cpu", "executor.skinny_gemm_max_rows=2", "executor.pdl=false"]))
    assert (linear_layers.SKINNY_ROWS, kernel_settings.pdl_max_rows) == (2, -1)
