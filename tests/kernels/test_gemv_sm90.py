"""The skinny-GEMM kernel compiled for the H200 (sm_90) on a machine without a GPU: Triton's code generator and its
bundled ptxas, no launch. Every config xrt picks for the Qwen3-0.6B and 8B linear layers at the decode batches it
runs them (gate_up gated, as the MLP runs it; qkv and gate_up also with the norm prologue where it applies, as
executor.fuse_norm runs them) must compile and keep its registers: a spill streams the tile through local memory,
far below the bandwidth the configs were measured at. Skipped without triton's CUDA toolchain, and on CUDA
machines, where the GPU tests launch the kernels themselves."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess

import pytest
import torch

triton = pytest.importorskip("triton")
if torch.cuda.is_available():
    pytest.skip("a CUDA machine launches the kernels (tests/kernels/test_gemv_gpu.py)", allow_module_level=True)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from xrt.kernels import gemv as g  # noqa: E402

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
SHAPES = {  # (N, K) of w, as the layers hold it
    "0.6b": {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
             "lm_head": (151936, 1024)},
    "8b": {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
           "lm_head": (151936, 4096)},
}
POINTERS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
            "res_ptr": "*bf16", "res_out_ptr": "*bf16", "nw_ptr": "*bf16", "eps": "fp32"}


def ptxas_report(K: int, cfg: g.GemvConfig, gated: bool, norm: bool, tmp: str) -> str:
    """ptxas -v's lines for the kernel as gemv() would launch it in bf16 with PDL."""
    k_split = triton.cdiv(K, cfg.split_k * cfg.block_k) * cfg.block_k
    constexprs = dict(K=K, K_POW2=triton.next_power_of_2(K), K_SPLIT=k_split, EVEN_K=k_split * cfg.split_k == K,
                      BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
                      USE_DOT=cfg.use_dot, PRECISION="tf32", DOT_FP32=False, GATED=gated, NORM=norm, PDL=True)
    names = g._gemv_kernel.arg_names
    assert not (set(constexprs) | set(POINTERS)) - set(names), "the kernel's arguments changed: update this test"
    signature = {n: "constexpr" if n in constexprs else POINTERS.get(n, "i32") for n in names}
    src = ASTSource(fn=g._gemv_kernel, signature=signature,
                    constexprs={(names.index(n),): v for n, v in constexprs.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptx = os.path.join(tmp, "gemv.ptx")
    with open(ptx, "w") as f:
        f.write(compiled.asm["ptx"])
    done = subprocess.run([PTXAS, "-v", "-arch=sm_90a", ptx, "-o", os.devnull], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def picked(model: str, layer: str, M: int) -> g.GemvConfig:
    N, K = SHAPES[model][layer]
    cfg = g.pick_config(M, N, K)
    return dataclasses.replace(cfg, block_n=2) if layer == "gate_up" and cfg.block_n == 1 else cfg  # as gemv()


def cases() -> list[tuple[str, str, int, bool]]:
    """Every (model, layer, decode batch), and with the norm where xrt::add_rms_norm_linear runs the prologue (the
    skinny GEMM's FMA path; elsewhere the norm runs apart)."""
    out = []
    for model, layers in SHAPES.items():
        for layer, (N, K) in layers.items():
            for M in (1, 2, 4, 8):
                out.append((model, layer, M, False))
                if layer in ("qkv", "gate_up") and g.prefer_gemv(M, N, K) and not picked(model, layer, M).use_dot:
                    out.append((model, layer, M, True))
    return out


@pytest.mark.skipif(not os.access(PTXAS, os.X_OK), reason="triton's bundled ptxas is missing")
@pytest.mark.parametrize(("model", "layer", "M", "norm"), cases(),
                         ids=[f"{m}-{layer}-M{M}{'-norm' if n else ''}" for m, layer, M, n in cases()])
def test_picked_configs_compile_for_sm90_without_spills(model: str, layer: str, M: int, norm: bool,
                                                        tmp_path: object) -> None:
    cfg = picked(model, layer, M)
    report = ptxas_report(SHAPES[model][layer][1], cfg, layer == "gate_up", norm, str(tmp_path))
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", report)]
    assert spills and max(spills) == 0, f"{model} {layer} M={M} {cfg}: {report.strip()}"
