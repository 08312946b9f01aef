"""The skinny-GEMM kernel on CPU under TRITON_INTERPRET=1, through the checks of tests/kernels/test_gemv_gpu.py on
shapes small enough for the interpreter (it runs each program in Python), plus the config heuristic on the
Qwen3-0.6B shapes. Skipped without triton and on CUDA machines (test_gemv_gpu.py runs the compiled kernel)."""

from __future__ import annotations

import pytest
import torch
from interpret_support import Interpreter

INTERPRETER = Interpreter("kernels/test_gemv_gpu.py")
checks = INTERPRETER.checks
in_process = INTERPRETER.in_process
CPU = torch.device("cpu")


@in_process
@pytest.mark.parametrize("dtype", checks.DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 37, 100), (2, 24, 1024), (3, 70, 129), (4, 9, 2048),
                                   (5, 33, 48), (16, 40, 100), (17, 50, 70), (70, 65, 33)], ids=str)
def test_picked_config(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    checks.check_gemv(CPU, dtype, *shape)


# Explicit configs on odd shapes: every row count of the FMA path, K tails, split-K on both paths, and more
# M tiles than one.
CONFIGS = [
    ("fma m1", (1, 8, 64, 2), (1, 19, 300)),
    ("fma m2 n1", (2, 1, 128, 1), (3, 5, 129)),
    ("fma m4", (4, 4, 256, 1), (7, 13, 1000)),
    ("fma m4 k-tail split", (4, 4, 64, 2, 4), (4, 21, 250)),
    ("fma m1 split", (1, 8, 512, 2, 2), (1, 64, 2048)),
    ("dot", (16, 16, 32, 4, 1, True), (5, 40, 100)),
    ("dot m-tiles", (16, 32, 64, 4, 1, True), (33, 70, 64)),
    ("dot split", (16, 16, 64, 4, 3, True), (9, 24, 192)),
]


@in_process
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("name", "cfg", "shape"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_explicit_config(dtype: torch.dtype, name: str, cfg: tuple, shape: tuple[int, int, int]) -> None:
    checks.check_gemv(CPU, dtype, *shape, config=checks.gemv_module().GemvConfig(*cfg))


@in_process
@pytest.mark.parametrize("shape", [(1, 24, 3072), (3, 24, 2048), (8, 40, 1024)], ids=str)
def test_candidate_configs(shape: tuple[int, int, int]) -> None:
    for cfg in checks.gemv_module().candidate_configs(*shape):
        checks.check_gemv(CPU, torch.float32, *shape, config=cfg)


GATED = [
    ("picked", None, (1, 12, 100)),
    ("picked rows", None, (3, 35, 129)),
    ("fma n1 -> one pair", (1, 1, 64, 2), (1, 8, 64)),
    ("fma m4 k-tail split", (4, 4, 64, 2, 4), (4, 21, 250)),
    ("fma m-tiles split", (2, 8, 64, 2, 3), (17, 12, 300)),
    ("dot", (16, 16, 32, 4, 1, True), (5, 20, 100)),
    ("dot split", (16, 16, 64, 4, 3, True), (9, 12, 192)),
]


@in_process
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("name", "cfg", "shape"), GATED, ids=[c[0] for c in GATED])
def test_gated(dtype: torch.dtype, name: str, cfg: tuple | None, shape: tuple[int, int, int]) -> None:
    checks.check_gated(CPU, dtype, *shape, config=cfg and checks.gemv_module().GemvConfig(*cfg))


@in_process
def test_gated_edges() -> None:
    checks.check_gated_edges(CPU)


@in_process
def test_split_k_repeats_and_resets_counters() -> None:
    checks.check_split_k_repeats(CPU, torch.float32)


@in_process
def test_out_and_leading_dims() -> None:
    checks.check_out_and_leading_dims(CPU, torch.float32)


@in_process
def test_edge_cases() -> None:
    checks.check_edge_cases(CPU)


@in_process
def test_warmup_runs_each_picked_config() -> None:
    checks.gemv_module().warmup_gemv([(24, 64), (8, 40)], [1, 3, 8], torch.bfloat16, CPU)


def test_pick_config_on_model_shapes() -> None:
    """The heuristic's configs are valid and, for Qwen3-0.6B at decode batch sizes, fill an H200 (>= 2 programs
    per SM), keep the FMA x/w layouts shared (K step 256 * warps), fit the FMA register budget, and split K
    only into even, non-empty parts."""
    g = checks.gemv_module()
    for N, K in checks.QWEN3_06B.values():
        for M in range(1, 17):
            cfg = g.heuristic_config(M, N, K)
            g.check_config(cfg)
            programs = -(-M // cfg.block_m) * -(-N // cfg.block_n) * cfg.split_k
            assert programs >= 256, (M, N, K, cfg, programs)
            assert K % (cfg.split_k * cfg.block_k) == 0, (M, N, K, cfg)
            if M <= 4:
                assert not cfg.use_dot and cfg.block_m >= M and cfg.block_k == 256 * cfg.num_warps, cfg
                assert g._fma_fits(cfg, K), cfg
            else:
                assert cfg.use_dot and cfg.block_m == 16, cfg


def test_heuristic_fits_registers_on_long_k() -> None:
    """Unmeasured shapes with a long K (Qwen3-8B's down: K = 12288) get an FMA tile whose w fits the register
    budget (a spilled tile streams far below bandwidth: bench/results/h200-issue26-s1)."""
    g = checks.gemv_module()
    for N, K in [*checks.QWEN3_8B.values(), (5120, 17408), (1024, 32768)]:
        for M in range(1, 5):
            cfg = g.heuristic_config(M, N, K)
            g.check_config(cfg)
            assert g._fma_fits(cfg, K), (M, N, K, cfg)


def test_measured_configs_are_valid_and_used() -> None:
    g = checks.gemv_module()
    for (N, K, M), cfg in g._MEASURED.items():
        g.check_config(cfg)
        assert cfg.use_dot or g._fma_fits(cfg, K), cfg
        assert g.pick_config(M, N, K) == cfg
    assert g.prefer_gemv(1, 4096, 1024) and g.prefer_gemv(8, 1024, 3072) and not g.prefer_gemv(9, 1024, 3072)
    # 0.6B's qkv and gate_up: the kernel up to M = 8 (3 takes 4's config, 5..8 the same tile), cuBLAS past it.
    for N, K in (checks.QWEN3_06B["qkv"], checks.QWEN3_06B["gate_up"]):
        assert [g.prefer_gemv(M, N, K) for M in range(1, 10)] == [True] * 8 + [False]
        assert g.pick_config(3, N, K) == g._MEASURED[(N, K, 4)]
        assert all(g.pick_config(M, N, K) == g._MEASURED[(N, K, 4)] for M in range(5, 9))
    # An 8B linear measured at 2 and 8 but not 4 takes the M = 8 winner at M = 3..8; the 8B lm_head at M = 2..4 takes
    # the tensor-core tile measured at 2 and 4, not the heuristic's FMA tile.
    for N, K in [v for k, v in checks.QWEN3_8B.items() if k != "lm_head"]:
        assert g.pick_config(2, N, K) == g._MEASURED[(N, K, 2)] != g._MEASURED[(N, K, 8)]
        for M in range(3, 9):
            assert g.pick_config(M, N, K) == g._MEASURED[(N, K, 8)]
    lm_head = checks.QWEN3_8B["lm_head"]
    assert g.pick_config(3, *lm_head) == g.pick_config(4, *lm_head) == g._MEASURED[(*lm_head, 4)]
    assert g.pick_config(2, *lm_head) == g._MEASURED[(*lm_head, 2)]
    for M in (2, 4):
        assert g.pick_config(M, *lm_head).use_dot and not g.heuristic_config(M, *lm_head).use_dot
    # 8B's linears at M = 2..8: the measured M = 8 winners, each faster than cuBLAS there.
    for N, K in checks.QWEN3_8B.values():
        assert all(g.prefer_gemv(M, N, K) for M in range(1, 9)) and not g.prefer_gemv(9, N, K)


def test_candidates_are_valid_and_distinct() -> None:
    g = checks.gemv_module()
    for N, K in checks.QWEN3_06B.values():
        for M in (1, 2, 4, 8, 16):
            cands = g.candidate_configs(M, N, K)
            assert cands[0] == g.pick_config(M, N, K)
            assert len(set(cands)) == len(cands) >= 4
            for cfg in cands:
                g.check_config(cfg)
                assert cfg.use_dot or g._fma_fits(cfg, K), cfg


@INTERPRETER.subprocess_only
def test_in_subprocess() -> None:
    INTERPRETER.rerun(__file__)
