"""The schema's behaviour switches reach the layers and kernels as arguments, never process-wide state:
`LayerOptions.of(cfg.executor)` is built per runner and handed to the model, each layer keeps its values and
decides PDL per launch (with the forward pass's `ForwardContext.pdl`), the kernels take that decision."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from op_log import XrtOpLog

from xrt.attention.context import forward_context
from xrt.config import ExecutorArgs, LogLevel
from xrt.layers.embedding import ParallelLMHead
from xrt.layers.linear import RowParallelLinear, _Linear
from xrt.layers.mlp import GatedMLP
from xrt.layers.norm import RMSNorm
from xrt.layers.options import DEFAULT_OPTIONS, LayerOptions, uses_pdl


@pytest.fixture(autouse=True)
def restore_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    xrt_logger = logging.getLogger("xrt")
    monkeypatch.setattr(xrt_logger, "level", xrt_logger.level)


def test_defaults_are_the_measured_values() -> None:
    assert DEFAULT_OPTIONS == LayerOptions(skinny_rows=8, pdl_max_rows=16, fuse_activation=True)
    assert not LayerOptions.of(ExecutorArgs(fuse_activation=False)).fuse_activation
    # the prefill epilogues are off until measured (bench/NOTES.md), each its own switch
    assert not DEFAULT_OPTIONS.fuse_qkv_epilogue and not DEFAULT_OPTIONS.fuse_prefill_activation
    assert LayerOptions.of(ExecutorArgs(fuse_qkv_epilogue=True)) == LayerOptions(8, 16, fuse_qkv_epilogue=True)
    assert LayerOptions.of(ExecutorArgs(fuse_prefill_activation=True)) == LayerOptions(8, 16,
                                                                                       fuse_prefill_activation=True)
    all_three = ExecutorArgs(fuse_qkv_epilogue=True, fuse_prefill_activation=True, fuse_prefill_norms=True)
    assert not DEFAULT_OPTIONS.fuse_prefill_norms and LayerOptions.of(all_three) == LayerOptions(
        8, 16, fuse_qkv_epilogue=True, fuse_prefill_activation=True, fuse_prefill_norms=True)
    assert all_three.check() == []
    # the norms run as the epilogue GEMMs' prologue: alone the switch is an error naming what it needs
    for alone in (ExecutorArgs(fuse_prefill_norms=True), ExecutorArgs(fuse_prefill_norms=True, fuse_qkv_epilogue=True)):
        assert alone.check() == [("fuse_prefill_norms", "needs fuse_qkv_epilogue=true and fuse_prefill_activation=true "
                                  "(the norms run as those GEMMs' prologue)")]
    assert LayerOptions.of(ExecutorArgs(pdl_max_rows=32, skinny_gemm_max_rows=4)) == LayerOptions(4, 32)
    assert LayerOptions.of(ExecutorArgs(pdl=False, pdl_max_rows=32)).pdl_max_rows == -1
    with pytest.raises(AttributeError):
        DEFAULT_OPTIONS.skinny_rows = 2  # type: ignore[misc]  (frozen: nothing rebinds it at run time)


def test_kernels_launch_with_pdl_where_asked_and_the_device_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = pytest.importorskip("xrt.kernels.launch")
    # As on a Hopper GPU: the hardware and Triton support PDL, so only the caller decides.
    monkeypatch.setattr(launch, "_pdl_on", lambda index: True)
    on_cuda = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert launch.pdl(on_cuda, 100, True) and not launch.pdl(on_cuda, 1, False)
    # None (a direct call: benchmarks, tests): the rows the default executor.pdl_max_rows gives
    assert launch.DEFAULT_PDL_MAX_ROWS == ExecutorArgs().pdl_max_rows
    assert launch.pdl(on_cuda, 16, None) and not launch.pdl(on_cuda, 17, None)
    assert not launch.pdl(torch.zeros(1), 1, True)  # never on the CPU


def test_layers_ask_for_pdl_by_rows_and_forward_pass() -> None:
    assert uses_pdl(16, 16) and not uses_pdl(17, 16) and not uses_pdl(0, -1)
    with forward_context(None, None, pdl=False):  # type: ignore[arg-type]  (the layers read only pdl here)
        assert not uses_pdl(1, 16)
    with forward_context(None, None):  # type: ignore[arg-type]
        assert uses_pdl(1, 16)
    assert uses_pdl(1, 16)  # outside a forward pass: by rows alone

    norms = {rows: RMSNorm(8, 1e-6, torch.float32, "cpu", LayerOptions(8, rows)) for rows in (-1, 4, 16)}
    log = XrtOpLog()
    x = torch.randn(4, 8)
    with log:
        for norm in norms.values():
            norm(x)
            norm.add_forward(x.clone(), x.clone())
        with forward_context(None, None, pdl=False):  # type: ignore[arg-type]
            norms[16](x)
    assert [args[-1] for args in log.args] == [False, False, True, True, True, True, False]


class _LooksCuda(torch.Tensor):
    """A CPU tensor the layers take for a CUDA one (they route on `is_cuda`)."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_each_layer_routes_by_its_own_options() -> None:
    """Two LM heads with their own skinny_rows and pdl_max_rows, called alternately: each keeps its own."""
    heads = [ParallelLMHead(16, 8, torch.float32, "cpu", options=LayerOptions(skinny_rows=s, pdl_max_rows=p))
             for s, p in ((8, 16), (4, 2))]
    hidden = torch.zeros(6, 8).as_subclass(_LooksCuda)
    log = XrtOpLog()
    with log:
        for head in heads + heads:
            head.compute_logits(hidden)
        heads[0].compute_logits(hidden[:3])
        heads[1].compute_logits(hidden[:3])
        heads[0].compute_logits(hidden[:3], pdl=False)  # the forward pass waited on KV loads
    linear = [(args[0].shape[0], args[2]) for name, args in zip(log.calls, log.args, strict=True) if name == "linear"]
    assert linear == [(6, True), (6, True), (3, True), (3, False), (3, False)]

    row = RowParallelLinear(8, 4, torch.float32, "cpu", options=LayerOptions(skinny_rows=2, pdl_max_rows=1))
    assert (row.skinny_rows, row.pdl_max_rows) == (2, 1)
    log = XrtOpLog()
    with log:
        row(torch.zeros(1, 8).as_subclass(_LooksCuda))
        row(torch.zeros(3, 8).as_subclass(_LooksCuda))
    assert [(args[0].shape[0], args[2]) for args in log.args] == [(1, True)]


def test_the_mlp_fuses_its_activation_where_the_skinny_gemm_runs() -> None:
    """executor.fuse_activation: CUDA batches of at most skinny_rows rows call xrt::linear_silu_and_mul (one launch,
    the activation in the GEMM's epilogue) where gate_up would run xrt::linear; larger batches, the CPU and the
    switch off keep gate_up and silu_and_mul apart. Every route computes the same values."""
    torch.manual_seed(0)
    mlps = {fuse: GatedMLP(8, 12, torch.float32, "cpu", options=LayerOptions(4, 16, fuse)) for fuse in (True, False)}
    for param in mlps[True].parameters():
        param.data.normal_()  # made empty (a checkpoint fills them)
    mlps[False].load_state_dict(mlps[True].state_dict())
    x = torch.randn(6, 8)
    routes = {}
    for fuse, mlp in mlps.items():
        for rows in (1, 4, 6):
            log = XrtOpLog()
            with log:
                out = mlp(x[:rows].as_subclass(_LooksCuda))
            routes[fuse, rows] = log.calls
            torch.testing.assert_close(out.as_subclass(torch.Tensor), mlps[False](x[:rows]), rtol=0, atol=0)
        log = XrtOpLog()
        with log:
            mlp(x[:1])
        routes[fuse, "cpu"] = log.calls
    fused, apart = ["linear_silu_and_mul", "linear"], ["linear", "silu_and_mul", "linear"]
    assert routes == {(True, 1): fused, (True, 4): fused, (True, 6): ["silu_and_mul"], (True, "cpu"): ["silu_and_mul"],
                      (False, 1): apart, (False, 4): apart, (False, 6): ["silu_and_mul"],
                      (False, "cpu"): ["silu_and_mul"]}


def test_the_runner_builds_its_model_with_its_options() -> None:
    from xrt.config.compose import load_config
    from xrt.executor.runner import ModelRunner
    from xrt.ops.parallel_state import SINGLE

    runner = ModelRunner(load_config(["device=cpu", "executor.skinny_gemm_max_rows=2", "executor.pdl=false",
                                      "log_level=warning"]))
    assert runner.options == LayerOptions(skinny_rows=2, pdl_max_rows=-1) and runner.tp_state is SINGLE
    linears = [m for m in runner.model.modules() if isinstance(m, _Linear)]
    assert linears and all((m.skinny_rows, m.pdl_max_rows) == (2, -1) for m in linears)
    assert (runner.model.lm_head.skinny_rows, runner.model.lm_head.pdl_max_rows) == (2, -1)
    norms = [m for m in runner.model.modules() if isinstance(m, RMSNorm)]
    assert norms and all(m.pdl_max_rows == -1 for m in norms)
    # log_level too, so that LLM(cfg) from Python honours it as the CLI does
    assert logging.getLogger("xrt.executor.runner").getEffectiveLevel() == logging.WARNING
    ModelRunner(load_config(["device=cpu", f"log_level={LogLevel.DEBUG.value}"]))
    assert logging.getLogger("xrt.executor.runner").isEnabledFor(logging.DEBUG)
