"""The fused-prologue skinny GEMM kernels on CPU under TRITON_INTERPRET=1, through the checks of
tests/kernels/test_gemv_fused_gpu.py on shapes small enough for the interpreter; the config rule on the Qwen3-0.6B
shapes; and the tiny model's decode with the interpreted kernels standing in for the fused ops' CPU
implementation. Skipped without triton and on CUDA machines (test_gemv_fused_gpu.py runs the compiled kernels)."""

from __future__ import annotations

import pytest
import torch
from interpret_support import Interpreter

INTERPRETER = Interpreter("kernels/test_gemv_fused_gpu.py")
checks = INTERPRETER.checks
in_process = INTERPRETER.in_process
CPU = torch.device("cpu")
DTYPES = [torch.float32, torch.bfloat16]
# (M, N, K) with the picked config: M = 1 on the FMA path (K tail, K split), the tensor-core path above.
SHAPES = [(1, 19, 300), (1, 40, 64), (2, 24, 129), (3, 33, 100), (8, 70, 96)]
# Explicit configs on odd shapes: every row count of the FMA path, K tails, split-K on both paths, more than one
# M tile.
CONFIGS = [
    ("fma m1", (1, 8, 64, 2), (1, 19, 300)),
    ("fma m2 n1", (2, 1, 128, 1), (3, 5, 129)),
    ("fma m4 k-tail split", (4, 4, 64, 2, 4), (4, 21, 250)),
    ("fma m4 m-tiles", (4, 2, 32, 1), (7, 9, 64)),
    ("dot", (16, 16, 32, 4, 1, True), (5, 40, 100)),
    ("dot m-tiles split", (16, 16, 64, 4, 3, True), (17, 24, 192)),
]


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_picked_config(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    checks.check_silu(CPU, dtype, *shape)
    checks.check_norm(CPU, dtype, *shape)


@in_process
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("name", "cfg", "shape"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_explicit_config(dtype: torch.dtype, name: str, cfg: tuple, shape: tuple[int, int, int]) -> None:
    config = checks.gemv_module().GemvConfig(*cfg)
    checks.check_silu(CPU, dtype, *shape, config=config)
    checks.check_norm(CPU, dtype, *shape, config=config)


@in_process
def test_split_k_repeats_and_resets_counters() -> None:
    checks.check_split_k_repeats(CPU, torch.float32)


@in_process
def test_edge_cases() -> None:
    checks.check_edge_cases(CPU)


@in_process
def test_strided_rows() -> None:
    """Rows at a stride (column slices of wider buffers), as the model never passes but the ops accept."""
    f = checks.fused_module()
    gate_up, w = checks.silu_inputs(3, 20, 48, torch.float32, seed=5)
    wide = torch.cat([gate_up, gate_up[:, :16]], dim=1)
    assert checks.rel_err(f.silu_and_mul_gemv(wide[:, :96], w), checks.silu_reference(gate_up, w)) < 1e-5
    x, r, nw, w = checks.norm_inputs(3, 20, 48, torch.float32, seed=6)
    y, h = f.add_rms_norm_gemv(torch.cat([r, x], 1)[:, 48:], torch.cat([x, r], 1)[:, 48:], nw, checks.EPS, w)
    ref, ref_h = checks.norm_reference(x, r, nw, w)
    assert checks.rel_err(y, ref) < 1e-5 and torch.equal(h, ref_h)


@in_process
def test_model_decode_with_the_kernels_as_the_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model in bf16 on CPU, the fused ops forced wherever a CUDA run would take them and their CPU
    implementation replaced by the interpreted kernels: same logits as unfused, fused ops called as on CUDA."""
    import xrt.layers.linear as linear_layers
    import xrt.ops  # noqa: F401  (defines the ops)

    f = checks.fused_module()
    monkeypatch.setattr(linear_layers, "uses_skinny_gemm", lambda x, w: True)
    with torch.library._scoped_library("xrt", "FRAGMENT") as lib:
        torch.library.register_kernel("xrt::silu_and_mul_linear", "cpu", f.silu_and_mul_gemv, lib=lib)
        torch.library.register_kernel("xrt::add_rms_norm_linear", "cpu", f.add_rms_norm_gemv, lib=lib)
        checks.check_model_decode(CPU, monkeypatch)


@in_process
def test_cuda_impls_run_the_kernels_exactly_where_linear_runs_gemv(monkeypatch: pytest.MonkeyPatch) -> None:
    """xrt.ops.cuda_impls' fused ops called directly on CPU tensors (their kernels run interpreted): the fused
    kernel for a 16-bit skinny batch, else the unfused kernels composed, bit for bit what the model runs
    unfused; importing the module only adds CUDA-key kernels, unused on CPU."""
    from xrt.ops import cuda_impls
    from xrt.ops.registry import implementation

    f = checks.fused_module()
    used: list[str] = []
    for name in ("silu_and_mul_gemv", "add_rms_norm_gemv"):
        real = getattr(f, name)
        monkeypatch.setattr(f, name, lambda *a, _real=real, _name=name: used.append(_name) or _real(*a))
    dtype, eps = torch.bfloat16, checks.EPS
    for M, fused in ((1, True), (9, False)):
        gate_up, w = checks.silu_inputs(M, 24, 40, dtype, seed=M)
        y = cuda_impls.silu_and_mul_linear(gate_up, w)
        assert checks.rel_err(y, checks.silu_reference(gate_up, w)) < checks.tolerance(dtype)
        x, r, nw, w = checks.norm_inputs(M, 24, 40, dtype, seed=M)
        x0, r0 = x.clone(), r.clone()
        qkv, h = cuda_impls.add_rms_norm_linear(x, r, nw, eps, w)
        ref, ref_h = checks.norm_reference(x, r, nw, w)
        assert checks.rel_err(qkv, ref) < checks.tolerance(dtype) and checks.rel_err(h, ref_h) < checks.tolerance(dtype)
        assert torch.equal(x, x0) and torch.equal(r, r0)
        assert used == (["silu_and_mul_gemv", "add_rms_norm_gemv"] if fused else []), (M, used)
        used.clear()
        if not fused:
            assert torch.equal(y, cuda_impls.linear(implementation("silu_and_mul", "cuda")(gate_up), w))
            implementation("fused_add_rms_norm", "cuda")(x0, r0, nw, eps)
            assert torch.equal(qkv, cuda_impls.linear(x0, w)) and torch.equal(h, r0)


def test_pick_fused_config_on_model_shapes() -> None:
    """Valid configs that keep the FMA path in its register budget, even K splits, fewer N tiles than gemv's
    picks where the prologue would be recomputed (M = 1) and enough programs to fill an H200 (>= 256)."""
    g, f = checks.gemv_module(), checks.fused_module()
    for N, K in (*checks.NORM_SHAPES.values(), *checks.SILU_SHAPES.values()):
        for M in range(1, 9):
            cfg = f.pick_fused_config(M, N, K)
            g.check_config(cfg)
            programs = -(-M // cfg.block_m) * -(-N // cfg.block_n) * cfg.split_k
            assert programs >= 256, (M, N, K, cfg, programs)
            assert K % (cfg.split_k * cfg.block_k) == 0, (M, N, K, cfg)
            if M == 1:
                assert not cfg.use_dot and g._fma_fits(cfg, K), cfg
                assert cfg.block_m * cfg.block_n * cfg.block_k <= f._FUSED_FMA_ACC * 32 * cfg.num_warps, cfg
                assert cfg.block_n > g.pick_config(M, N, K).block_n, cfg
            else:
                assert cfg.use_dot and cfg.block_n == f._FUSED_DOT_BLOCK_N, cfg


@INTERPRETER.subprocess_only
def test_in_subprocess() -> None:
    INTERPRETER.rerun(__file__)
