"""The skinny-GEMM kernel compiled for the H200 (sm_90) on a machine without a GPU (tests/sm90_support.py): every
config xrt picks for the Qwen3-0.6B and 8B linear layers at the decode batches it runs them (gate_up gated, as the
MLP runs it), as `gemv()` launches it, must compile and keep its registers: a spill streams the tile through local
memory, far below the bandwidth the configs were measured at. Skipped without triton's CUDA toolchain, and on CUDA
machines, where the GPU tests launch the kernels themselves."""

from __future__ import annotations

import pytest
import torch
from sm90_support import Compiler, launches, ptxas_report, spill_bytes

COMPILER = Compiler("kernels/test_gemv_gpu.py")

from xrt.kernels import gemv as g  # noqa: E402

SHAPES = {  # (N, K) of w, as the layers hold it
    "0.6b": {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
             "lm_head": (151936, 1024)},
    "8b": {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
           "lm_head": (151936, 4096)},
}


CASES = COMPILER.cases([(model, layer, M) for model, layers in SHAPES.items() for layer in layers
                        for M in (1, 2, 3, 4, 8)])


@COMPILER.in_process
@pytest.mark.parametrize(("model", "layer", "M"), CASES, ids=[f"{m}-{layer}-M{M}" for m, layer, M in CASES])
def test_picked_configs_compile_for_sm90_without_spills(model: str, layer: str, M: int, tmp_path: object) -> None:
    N, K = SHAPES[model][layer]
    x = torch.empty(M, K, dtype=torch.bfloat16)
    w = torch.empty(1, K, dtype=torch.bfloat16).expand(N, K)  # the shape alone: no gigabyte of lm_head
    (launch,) = launches(lambda: g.gemv(x, w, gated=layer == "gate_up"))
    report = ptxas_report(launch, str(tmp_path))
    assert spill_bytes(report) == 0, f"{model} {layer} M={M}: {report.strip()}"


@COMPILER.subprocess_only
def test_in_subprocess() -> None:
    COMPILER.rerun(__file__)
