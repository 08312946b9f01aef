"""xrt.kernels.qkv_gemm, gate_up_gemm and residual_gemm on CPU under TRITON_INTERPRET=1, through
tests/kernels/test_prefill_gemm_gpu.py's checks, on small shapes and tiles (the interpreter runs each program in
Python). Skipped without triton (CI) and on CUDA machines, where test_prefill_gemm_gpu.py runs the compiled
kernels."""

from __future__ import annotations

import pytest
import torch
from interpret_support import Interpreter

INTERPRETER = Interpreter("kernels/test_prefill_gemm_gpu.py")
checks = INTERPRETER.checks
in_process = INTERPRETER.in_process
CPU = torch.device("cpu")
TILES = {"block_m": 16, "block_k": 32, "num_warps": 4}


@in_process
@pytest.mark.parametrize("variant", [{}, {"one_dot": False}, {"tma": True}], ids=["one-dot", "dot-per-half", "tma"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("n_tokens", "heads", "kv_heads", "head_dim", "hidden", "page_size"),
                         [(37, 4, 2, 32, 64, 4), (16, 2, 1, 64, 96, 16), (1, 3, 3, 32, 32, 1)], ids=str)
def test_linear_qk_norm_rope_store_kv(dtype: torch.dtype, n_tokens: int, heads: int, kv_heads: int, head_dim: int,
                                      hidden: int, page_size: int, variant: dict) -> None:
    checks.check_linear_qk_norm_rope_store_kv(CPU, dtype, n_tokens, heads, kv_heads, head_dim, hidden, page_size,
                                              **variant, **TILES)


@in_process
@pytest.mark.parametrize("variant", [{}, {"one_dot": False}, {"tma": True}], ids=["one-dot", "dot-per-half", "tma"])
def test_linear_qk_norm_rope_store_kv_norm_prologue(variant: dict) -> None:
    checks.check_linear_qk_norm_rope_store_kv(CPU, torch.bfloat16, 37, 4, 2, 32, 64, 4, norm=True, **variant,
                                              **TILES)


@in_process
def test_rejects_fp32_and_small_heads() -> None:
    from xrt.kernels.qkv_gemm import linear_qk_norm_rope_store_kv, supports

    assert supports(torch.zeros(2, 64, dtype=torch.bfloat16), 32, 32)
    assert not supports(torch.zeros(2, 64), 32, 32)  # fp32: no 16-bit tensor-core dot
    assert not supports(torch.zeros(2, 64, dtype=torch.bfloat16), 16, 32)  # a half of 8 columns
    assert not supports(torch.zeros(2, 48, dtype=torch.bfloat16), 32, 32)  # hidden off the K step
    cache = torch.zeros(2, 2, 4, 1, 16)
    with pytest.raises(ValueError, match="head_dim a power of two >= 32"):
        linear_qk_norm_rope_store_kv(torch.zeros(2, 64), torch.zeros(48, 64), torch.ones(16), torch.ones(16),
                                     torch.zeros(8, 16), torch.zeros(2, dtype=torch.int64), cache,
                                     torch.zeros(2, dtype=torch.int64), 1, 1, 16, 1e-6)


@in_process
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("n_tokens", "inter", "hidden", "block_n", "tma"),
                         [(37, 48, 64, 16, False), (5, 40, 96, 16, False), (17, 32, 32, 32, False),
                          (37, 48, 64, 16, True)], ids=str)
def test_linear_silu_and_mul(dtype: torch.dtype, n_tokens: int, inter: int, hidden: int, block_n: int,
                             tma: bool) -> None:
    checks.check_linear_silu_and_mul(CPU, dtype, n_tokens, inter, hidden, block_m=16, block_n=block_n, block_k=32,
                                     num_warps=4, tma=tma)


@in_process
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_linear_silu_and_mul_norm_prologue(tma: bool) -> None:
    checks.check_linear_silu_and_mul(CPU, torch.bfloat16, 37, 48, 64, norm=True, block_m=16, block_n=16, block_k=32,
                                     num_warps=4, tma=tma)


@in_process
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("n_tokens", "out_features", "in_features"), [(37, 48, 64), (5, 40, 96), (16, 32, 32)],
                         ids=str)
def test_linear_add(dtype: torch.dtype, n_tokens: int, out_features: int, in_features: int) -> None:
    checks.check_linear_add(CPU, dtype, n_tokens, out_features, in_features, block_m=16, block_n=16, block_k=32,
                            num_warps=4)


@in_process
def test_linear_add_tma() -> None:
    checks.check_linear_add(CPU, torch.bfloat16, 37, 48, 64, block_m=16, block_n=16, block_k=32, num_warps=4,
                            tma=True)


@in_process
def test_linear_add_rejects_what_it_does_not_take() -> None:
    from xrt.kernels.residual_gemm import linear_add, supports

    bf = torch.bfloat16
    assert supports(torch.zeros(2, 64, dtype=bf), 32) and not supports(torch.zeros(2, 64), 32)
    with pytest.raises(ValueError, match="multiple of 32"):
        linear_add(torch.zeros(2, 48, dtype=bf), torch.zeros(8, 48, dtype=bf), torch.zeros(2, 8, dtype=bf),
                   block_k=32)
    with pytest.raises(ValueError, match=r"residual: expected \[2, 8\]"):
        linear_add(torch.zeros(2, 64, dtype=bf), torch.zeros(8, 64, dtype=bf), torch.zeros(2, 7, dtype=bf))
    with pytest.raises(ValueError, match="norm_weight: expected a contiguous"):
        from xrt.kernels.gate_up_gemm import linear_silu_and_mul

        linear_silu_and_mul(torch.zeros(2, 64, dtype=bf), torch.zeros(8, 64, dtype=bf), torch.ones(32, dtype=bf))


@in_process
def test_gate_up_rejects_what_it_does_not_take() -> None:
    from xrt.kernels.gate_up_gemm import linear_silu_and_mul, supports

    assert supports(torch.zeros(2, 64, dtype=torch.bfloat16), 32) and not supports(torch.zeros(2, 64), 32)
    with pytest.raises(ValueError, match="multiple of 32"):
        linear_silu_and_mul(torch.zeros(2, 48, dtype=torch.bfloat16), torch.zeros(8, 48, dtype=torch.bfloat16),
                            block_k=32)
    with pytest.raises(ValueError, match="tma needs the intermediate size in whole 16-column tiles, got 20"):
        linear_silu_and_mul(torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(40, 64, dtype=torch.bfloat16),
                            block_n=16, tma=True)
    with pytest.raises(ValueError, match="weight: expected a contiguous"):
        linear_silu_and_mul(torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(7, 64, dtype=torch.bfloat16))


@INTERPRETER.subprocess_only
def test_in_subprocess() -> None:
    INTERPRETER.rerun(__file__)
