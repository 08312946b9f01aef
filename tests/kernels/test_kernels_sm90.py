"""xrt's other Triton kernels compiled for the H200 (sm_90) on a machine without a GPU (tests/sm90_support.py), as their
wrappers launch them for the Qwen3-0.6B and 8B shapes: the norms, silu_and_mul, q/k norm + RoPE with and without the
KV write, store_kv, the qkv GEMM with them in its epilogue, the gate_up GEMM with the activation in its (both also
with the RMSNorm as their prologue), the o_proj / down GEMM with the residual add in its (both tiles), the split-KV
decode attention (plain, and with the q/k norm, RoPE and KV write inside), the tiers' row copy, the greedy argmax.
Each must compile and not spill. Skipped without triton's CUDA toolchain, and on CUDA machines, where the GPU tests
launch the kernels themselves."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from sm90_support import Compiler, launches, ptxas_report, spill_bytes

COMPILER = Compiler("kernels/test_kernels_gpu.py")

from xrt.kernels.argmax import argmax_rows  # noqa: E402
from xrt.kernels.copy_rows import copy_rows  # noqa: E402
from xrt.kernels.decode_attention import DecodeAttention, QKNormRope  # noqa: E402
from xrt.kernels.gate_up_gemm import linear_silu_and_mul  # noqa: E402
from xrt.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv  # noqa: E402
from xrt.kernels.qkv_gemm import linear_qk_norm_rope_store_kv  # noqa: E402
from xrt.kernels.residual_gemm import linear_add  # noqa: E402
from xrt.kernels.rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from xrt.kernels.silu_and_mul import silu_and_mul  # noqa: E402
from xrt.kernels.store_kv import store_kv  # noqa: E402

BF16 = torch.bfloat16
# hidden, intermediate, q heads, kv heads, head_dim
MODELS = {"0.6b": (1024, 3072, 16, 8, 128), "8b": (4096, 12288, 32, 8, 128)}
PAGE = 16
TOKENS = 2


def calls(model: str) -> dict[str, Callable[[], object]]:
    hidden, inter, heads, kv_heads, d = MODELS[model]
    x, res, w = torch.empty(TOKENS, hidden, dtype=BF16), torch.empty(TOKENS, hidden, dtype=BF16), torch.empty(hidden,
                                                                                                              dtype=BF16)
    qkv = torch.empty(TOKENS, (heads + 2 * kv_heads) * d, dtype=BF16)
    head_w, cos_sin = torch.empty(d, dtype=BF16), torch.empty(64, d, dtype=torch.float32)
    positions, slots = torch.zeros(TOKENS, dtype=torch.int64), torch.zeros(TOKENS, dtype=torch.int64)
    cache = torch.empty(4, 2, PAGE, kv_heads, d, dtype=BF16)
    k = qkv[:, heads * d:(heads + kv_heads) * d].view(TOKENS, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d:].view(TOKENS, kv_heads, d)
    attention = DecodeAttention(8, heads, kv_heads, d, PAGE, 64, "cpu")
    indptr, indices, last = (torch.tensor(t, dtype=torch.int32) for t in ([0, 2], [0, 1], [5]))
    return {
        "rms_norm": lambda: rms_norm(x, w, 1e-6),
        "fused_add_rms_norm": lambda: fused_add_rms_norm(x, res, w, 1e-6),
        "silu_and_mul": lambda: silu_and_mul(torch.empty(TOKENS, 2 * inter, dtype=BF16)),
        "qk_norm_rope": lambda: qk_norm_rope(qkv, head_w, head_w, cos_sin, positions, heads, kv_heads, d, 1e-6),
        "qk_norm_rope_store_kv": lambda: qk_norm_rope_store_kv(qkv, head_w, head_w, cos_sin, positions, cache, slots,
                                                               heads, kv_heads, d, 1e-6),
        "store_kv": lambda: store_kv(k, v, cache, slots),
        "linear_qk_norm_rope_store_kv": lambda: linear_qk_norm_rope_store_kv(
            x, torch.empty(qkv.shape[1], hidden, dtype=BF16), head_w, head_w, cos_sin, positions, cache, slots, heads,
            kv_heads, d, 1e-6),
        "linear_qk_norm_rope_store_kv tma": lambda: linear_qk_norm_rope_store_kv(
            x, torch.empty(qkv.shape[1], hidden, dtype=BF16), head_w, head_w, cos_sin, positions, cache, slots, heads,
            kv_heads, d, 1e-6, tma=True),
        "linear_qk_norm_rope_store_kv norm": lambda: linear_qk_norm_rope_store_kv(
            x, torch.empty(qkv.shape[1], hidden, dtype=BF16), head_w, head_w, cos_sin, positions, cache, slots, heads,
            kv_heads, d, 1e-6, w),
        "gate_up linear_silu_and_mul": lambda: linear_silu_and_mul(x, torch.empty(2 * inter, hidden, dtype=BF16)),
        "gate_up linear_silu_and_mul norm": lambda: linear_silu_and_mul(
            x, torch.empty(2 * inter, hidden, dtype=BF16), w),
        "linear_add o_proj": lambda: linear_add(torch.empty(TOKENS, heads * d, dtype=BF16),
                                                torch.empty(hidden, heads * d, dtype=BF16), res),
        "linear_add down": lambda: linear_add(torch.empty(TOKENS, inter, dtype=BF16),
                                              torch.empty(hidden, inter, dtype=BF16), res),
        "linear_add down tma": lambda: linear_add(torch.empty(TOKENS, inter, dtype=BF16),
                                                  torch.empty(hidden, inter, dtype=BF16), res, tma=True),
        "linear_add down small tile": lambda: linear_add(torch.empty(TOKENS, inter, dtype=BF16),
                                                         torch.empty(hidden, inter, dtype=BF16), res, block_m=64,
                                                         num_warps=4),
        "gate_up linear_silu_and_mul tma": lambda: linear_silu_and_mul(x, torch.empty(2 * inter, hidden, dtype=BF16),
                                                                       tma=True),
        "decode_attention": lambda: attention.run(qkv[:1, :heads * d].view(1, heads, d), cache, indptr, indices,
                                                  last, d**-0.5),
        "decode_attention rope": lambda: attention.run(
            qkv[:1].view(1, heads + 2 * kv_heads, d), cache, indptr, indices, last, d**-0.5,
            rope=QKNormRope(head_w, head_w, cos_sin, positions, slots, 1e-6)),
        "copy_rows": lambda: copy_rows(torch.empty(4, 4096, dtype=BF16), torch.empty(4, 4096, dtype=BF16), 4),
        "argmax_rows": lambda: argmax_rows(torch.empty(TOKENS, 151936, dtype=BF16),
                                           torch.empty(TOKENS, dtype=torch.int64)),
    }


CASES = COMPILER.cases([(model, name) for model in MODELS for name in calls(model)])


@COMPILER.in_process
@pytest.mark.parametrize(("model", "name"), CASES, ids=[f"{m}-{n.replace(' ', '-')}" for m, n in CASES])
def test_kernels_compile_for_sm90_without_spills(model: str, name: str, tmp_path: object) -> None:
    recorded = launches(calls(model)[name])
    assert recorded, f"{name}: no Triton launch"
    for launch in recorded:
        report = ptxas_report(launch, str(tmp_path))
        assert spill_bytes(report) == 0, f"{model} {name} ({launch.name}): {report.strip()}"


@COMPILER.subprocess_only
def test_in_subprocess() -> None:
    COMPILER.rerun(__file__)
