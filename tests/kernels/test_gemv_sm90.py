"""The skinny-GEMM kernel compiled for the H200 (sm_90) on a machine without a GPU (tests/sm90_support.py): every
config xrt picks for the Qwen3-0.6B and 8B linear layers at the decode batches it runs them (gate_up gated, as the
MLP runs it; qkv and gate_up also with the norm prologue where it applies, as executor.fuse_norm runs them), as
`gemv()` launches it, must compile and keep its registers: a spill streams the tile through local memory, far below
the bandwidth the configs were measured at. Skipped without triton's CUDA toolchain, and on CUDA machines, where
the GPU tests launch the kernels themselves."""

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


def norm_applies(M: int, N: int, K: int) -> bool:
    """Where xrt::add_rms_norm_linear runs the prologue: the skinny GEMM's FMA path (elsewhere the norm apart)."""
    return g.prefer_gemv(M, N, K) and not g.pick_config(M, N, K).use_dot


def cases() -> list[tuple[str, str, int, bool]]:
    out = []
    for model, layers in SHAPES.items():
        for layer, (N, K) in layers.items():
            for M in (1, 2, 4, 8):
                out.append((model, layer, M, False))
                if layer in ("qkv", "gate_up") and norm_applies(M, N, K):
                    out.append((model, layer, M, True))
    return out


@COMPILER.in_process
@pytest.mark.parametrize(("model", "layer", "M", "norm"), COMPILER.cases(cases()),
                         ids=[f"{m}-{layer}-M{M}{'-norm' if n else ''}" for m, layer, M, n in COMPILER.cases(cases())])
def test_picked_configs_compile_for_sm90_without_spills(model: str, layer: str, M: int, norm: bool,
                                                        tmp_path: object) -> None:
    N, K = SHAPES[model][layer]
    x = torch.empty(M, K, dtype=torch.bfloat16)
    w = torch.empty(1, K, dtype=torch.bfloat16).expand(N, K)  # the shape alone: no gigabyte of lm_head
    prologue = g.NormPrologue(torch.empty_like(x), torch.empty(K, dtype=torch.bfloat16), 1e-6, torch.empty_like(x))
    (launch,) = launches(lambda: g.gemv(x, w, gated=layer == "gate_up", norm=prologue if norm else None))
    assert launch.arg("NORM") == norm
    report = ptxas_report(launch, str(tmp_path))
    assert spill_bytes(report) == 0, f"{model} {layer} M={M}: {report.strip()}"


@COMPILER.subprocess_only
def test_in_subprocess() -> None:
    COMPILER.rerun(__file__)
