"""The Triton kernels on CPU under TRITON_INTERPRET=1, through the same checks as tests/kernels/test_kernels_gpu.py
(on fewer shapes: the interpreter runs each program in Python). Skipped without triton (CI) and on CUDA
machines, where test_kernels_gpu.py runs the compiled kernels instead."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from interpret_support import Interpreter

INTERPRETER = Interpreter("kernels/test_kernels_gpu.py")
checks = INTERPRETER.checks
in_process = INTERPRETER.in_process
DTYPES = checks.DTYPES
CPU = torch.device("cpu")


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1024), (3, 1000), (2, 64)], ids=str)
def test_rms_norm(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    checks.check_rms_norm(CPU, dtype, *shape)


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1024), (3, 1000)], ids=str)
def test_fused_add_rms_norm(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    checks.check_fused_add_rms_norm(CPU, dtype, *shape)


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5, 9000), (2, 3)], ids=str)
def test_argmax_rows(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    checks.check_argmax_rows(CPU, dtype, *shape)


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 3072), (3, 100)], ids=str)
def test_silu_and_mul(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    checks.check_silu_and_mul(CPU, dtype, *shape)


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 16, 8, 128), (3, 4, 2, 16), (2, 3, 3, 6)], ids=str)
def test_qk_norm_rope(dtype: torch.dtype, shape: tuple[int, int, int, int]) -> None:
    checks.check_qk_norm_rope(CPU, dtype, *shape)


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 16, 8, 128, 16), (9, 4, 2, 16, 4), (5, 3, 3, 6, 1)], ids=str)
def test_qk_norm_rope_store_kv(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    checks.check_qk_norm_rope_store_kv(CPU, dtype, *shape)


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 8, 128, 16), (19, 2, 16, 4), (5, 3, 6, 1)], ids=str)
def test_store_kv(dtype: torch.dtype, shape: tuple[int, int, int, int]) -> None:
    checks.check_store_kv(CPU, dtype, *shape)


@in_process
def test_layouts() -> None:
    checks.check_layouts(CPU)


@in_process
def test_empty_batch_is_a_no_op() -> None:
    checks.test_empty_batch_is_a_no_op(CPU)


@in_process
def test_cuda_impls_forward_to_the_kernels() -> None:
    """The op implementations registered for CUDA, called directly on CPU tensors (interpreted kernels)."""
    from xrt.ops import (
        cuda_impls,  # noqa: F401  (registers them)
        reference,
    )
    from xrt.ops.registry import implementation

    def cuda(name: str):  # noqa: ANN202
        return implementation(name, "cuda")

    gen, dtype, eps = torch.Generator().manual_seed(3), torch.float32, 1e-6
    x, res, w = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen), torch.randn(64, generator=gen)
    checks.assert_close(cuda("rms_norm")(x, w, eps), reference.rms_norm(x, w, eps), dtype, "rms_norm")
    x2, res2 = x.clone(), res.clone()
    cuda("fused_add_rms_norm")(x, res, w, eps)
    reference.fused_add_rms_norm(x2, res2, w, eps)
    checks.assert_close(x, x2, dtype, "fused_add_rms_norm")
    gu = torch.randn(3, 96, generator=gen)
    checks.assert_close(cuda("silu_and_mul")(gu), reference.silu_and_mul(gu), dtype, "silu_and_mul")
    qkv = torch.randn(3, (4 + 2 * 2) * 16, generator=gen)
    q_w, k_w = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    cos_sin, pos = checks.rope_cache(32, 16), torch.tensor([0, 5, 31])
    cache, slots = torch.randn(2, 2, 4, 2, 16, generator=gen), torch.tensor([7, -1, 0])
    ref_qkv, ref_cache = qkv.clone(), cache.clone()
    cuda("qk_norm_rope_store_kv")(qkv, q_w, k_w, cos_sin, pos, cache, slots, 4, 2, 16, eps)
    reference.qk_norm_rope_store_kv(ref_qkv, q_w, k_w, cos_sin, pos, ref_cache, slots, 4, 2, 16, eps)
    checks.assert_close(qkv, ref_qkv, dtype, "qk_norm_rope_store_kv qkv")
    checks.assert_close(cache, ref_cache, dtype, "qk_norm_rope_store_kv cache")
    cuda("qk_norm_rope")(qkv, q_w, k_w, cos_sin, pos, 4, 2, 16, eps)
    reference.qk_norm_rope(ref_qkv, q_w, k_w, cos_sin, pos, 4, 2, 16, eps)
    checks.assert_close(qkv, ref_qkv, dtype, "qk_norm_rope")
    k, v = qkv[:, 64:96].view(3, 2, 16), qkv[:, 96:].view(3, 2, 16)
    cuda("store_kv")(k, v, cache, slots)
    reference.store_kv(k, v, ref_cache, slots)
    assert torch.equal(cache, ref_cache)


def test_every_op_with_a_kernel_is_registered_for_cuda() -> None:
    from xrt.ops import cuda_impls

    names = [*cuda_impls.KERNELS, "linear"]
    for name in names:
        assert hasattr(torch.ops.xrt, name), f"xrt::{name} is not defined in xrt.ops"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"xrt::{name}", "CUDA"), f"xrt::{name}: no CUDA kernel"


@in_process
def test_warmup_runs_every_kernel() -> None:
    from xrt.kernels.warmup import warmup_kernels

    warmup_kernels(64, 96, 4, 2, 16, 4, torch.bfloat16, CPU)


@INTERPRETER.subprocess_only
def test_in_subprocess() -> None:
    INTERPRETER.rerun(__file__)


def test_importing_cuda_impls_does_not_import_triton() -> None:
    code = "import sys, xrt.ops.cuda_impls; assert 'triton' not in sys.modules, 'triton imported'"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
