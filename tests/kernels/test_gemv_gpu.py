"""The skinny-GEMM kernel (xrt.kernels.gemv) against x.float() @ w.float().T: picked and candidate configs,
split-K, odd shapes, out= and leading dims, and replay inside a CUDA graph.

The check_* functions are device-agnostic so test_gemv_interpret.py runs them on CPU under
TRITON_INTERPRET=1; the kernel module is imported inside them, so collecting this file never imports triton."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import pytest
import torch

# Max |out - ref| / max |ref|; ref is the fp32 product, out is rounded once to the dtype (1 ulp of bf16 is
# ~8e-3 of a value; the interpreter rounds toward zero).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Qwen3-0.6B linear layers, (N, K): qkv, o_proj, gate_up, down, lm_head.
QWEN3_06B = {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
             "lm_head": (151936, 1024)}
QWEN3_8B = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
            "lm_head": (151936, 4096)}


def gemv_module() -> ModuleType:
    return importlib.import_module("xrt.kernels.gemv")


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().cpu().float(), ref.detach().cpu().float()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "kernel produced non-finite values"
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@functools.lru_cache(maxsize=8)
def weight(N: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """A random w [N, K] on the CPU, one per shape and dtype: lm_head's 155M values take seconds to draw, and
    the suite asks for them dozens of times (x, drawn per seed, is what varies between the checks)."""
    gen = torch.Generator().manual_seed(N * 100_003 + K)
    return (torch.randn(N, K, generator=gen) * K ** -0.5).to(dtype)


def inputs(M: int, N: int, K: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # Nonzero mean: a dropped or duplicated K chunk shifts every output, not just its noise.
    x = (torch.randn(M, K, generator=gen) + 0.5).to(dtype)
    return x, weight(N, K, dtype)


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.cpu().float() @ w.cpu().float().T


def check_gemv(device: torch.device, dtype: torch.dtype, M: int, N: int, K: int, config: object = None,
               seed: int = 0) -> None:
    check_configs(device, dtype, M, N, K, [config], seed)


def check_configs(device: torch.device, dtype: torch.dtype, M: int, N: int, K: int, configs: list,
                  seed: int = 0) -> None:
    """gemv with each config (None: the picked one) on the same inputs, uploaded and referenced once."""
    x, w = inputs(M, N, K, dtype, seed)
    ref = reference(x, w)
    x_dev, w_dev = x.to(device), w.to(device)
    for config in configs:
        out = gemv_module().gemv(x_dev, w_dev, config=config)
        assert out.dtype == dtype and out.shape == (M, N) and out.device.type == torch.device(device).type
        err = rel_err(out, ref)
        assert err < TOLERANCE[dtype], f"gemv {dtype} M={M} N={N} K={K} {config}: relative error {err:.3e}"


def check_split_k_repeats(device: torch.device, dtype: torch.dtype) -> None:
    """Split-K twice with the same counters (they must reset), more than one M tile, K not a multiple of the
    split range, for both the FMA and the dot path."""
    g = gemv_module()
    for cfg in (g.GemvConfig(2, 8, 64, 2, split_k=3), g.GemvConfig(16, 16, 32, 4, split_k=4, use_dot=True)):
        for seed in (1, 2):
            check_gemv(device, dtype, 17, 24, 300, cfg, seed)
    for counters in (c for bufs in g._counters.values() for c in bufs):
        assert int(counters.abs().sum()) == 0, "split-K arrival counters were not reset"


def check_out_and_leading_dims(device: torch.device, dtype: torch.dtype) -> None:
    g = gemv_module()
    x, w = inputs(6, 24, 80, dtype, seed=3)
    ref = reference(x, w)
    # Leading dims are flattened like F.linear.
    out = g.gemv(x.view(2, 3, 80).to(device), w.to(device))
    assert out.shape == (2, 3, 24)
    assert rel_err(out.reshape(6, 24), ref) < TOLERANCE[dtype]
    # Rows of a wider buffer: the gap columns stay untouched.
    buf = torch.full((6, 32), 7.0, dtype=dtype, device=device)
    ret = g.gemv(x.to(device), w.to(device), out=buf[:, :24])
    assert ret.data_ptr() == buf.data_ptr()
    assert rel_err(buf[:, :24], ref) < TOLERANCE[dtype]
    assert torch.all(buf[:, 24:].cpu() == 7.0)
    # Strided x rows (a column slice) and a one-row x view with an arbitrary row stride.
    wide = torch.cat([x, x], dim=1).to(device)
    assert rel_err(g.gemv(wide[:, 80:], w.to(device)), ref) < TOLERANCE[dtype]
    assert rel_err(g.gemv(wide[2:3, :80], w.to(device)), ref[2:3]) < TOLERANCE[dtype]


def check_edge_cases(device: torch.device) -> None:
    g = gemv_module()
    w = torch.randn(5, 8, device=device)
    assert g.gemv(torch.randn(0, 8, device=device), w).shape == (0, 5)
    zero_k = g.gemv(torch.randn(3, 0, device=device), torch.randn(5, 0, device=device))
    assert zero_k.shape == (3, 5) and torch.all(zero_k.cpu() == 0)
    with pytest.raises(ValueError, match=r"gemv x: expected \[\.\.\., 8\]"):
        g.gemv(torch.randn(2, 7, device=device), w)
    with pytest.raises(ValueError, match="gemv w: expected"):
        g.gemv(torch.randn(2, 5, device=device), w.T)
    with pytest.raises(ValueError, match="share dtype"):
        g.gemv(torch.randn(2, 8, device=device, dtype=torch.float16), w)
    with pytest.raises(ValueError, match="gemv out: expected shape"):
        g.gemv(torch.randn(2, 8, device=device), w, out=torch.empty(2, 4, device=device))
    with pytest.raises(ValueError, match="block_n: expected a power of two"):
        g.gemv(torch.randn(2, 8, device=device), w, config=g.GemvConfig(1, 3, 8))
    with pytest.raises(ValueError, match="at most 4 rows"):
        g.gemv(torch.randn(2, 8, device=device), w, config=g.GemvConfig(8, 4, 8))
    with pytest.raises(ValueError, match=">= 16"):
        g.gemv(torch.randn(2, 8, device=device), w, config=g.GemvConfig(16, 8, 16, use_dot=True))


def gated_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) in fp32, w = [gate; up]."""
    y = reference(x, w)
    half = w.shape[0] // 2
    return torch.nn.functional.silu(y[:, :half]) * y[:, half:]


def check_gated(device: torch.device, dtype: torch.dtype, M: int, inter: int, K: int, config: object = None,
                seed: int = 0) -> None:
    """gemv(gated=True) against the fp32 reference, and against what it replaces (the same config's gate_up
    product, then the silu_and_mul kernel): equal bit for bit in 16-bit (each output is the same sum over K, and
    gate and up are rounded before the activation as the unfused path does)."""
    g = gemv_module()
    silu_and_mul = importlib.import_module("xrt.kernels.silu_and_mul").silu_and_mul
    x, w = inputs(M, 2 * inter, K, dtype, seed)
    x_dev, w_dev = x.to(device), w.to(device)
    out = g.gemv(x_dev, w_dev, config=config, gated=True)
    assert out.dtype == dtype and out.shape == (M, inter)
    err = rel_err(out, gated_reference(x, w))
    # Three roundings (gate, up, the product) against the fp32 reference's one.
    assert err < 2 * TOLERANCE[dtype], f"gated gemv {dtype} M={M} I={inter} K={K} {config}: relative error {err:.3e}"
    cfg = config or g.pick_config(M, 2 * inter, K)
    if cfg.block_n == 1:  # the gated kernel's tile holds at least one (gate, up) pair
        cfg = g.GemvConfig(cfg.block_m, 2, cfg.block_k, cfg.num_warps, cfg.split_k, cfg.use_dot, cfg.num_stages)
    apart = silu_and_mul(g.gemv(x_dev, w_dev, config=cfg))
    if dtype == torch.float32:
        assert rel_err(out, apart) < 1e-5
    else:
        assert torch.equal(out.cpu(), apart.cpu()), f"gated gemv {dtype} M={M} I={inter} K={K} {cfg}: not unfused's"


def check_gated_edges(device: torch.device) -> None:
    g = gemv_module()
    with pytest.raises(ValueError, match=r"gemv gated w: expected \[2 \* I, K\]"):
        g.gemv(torch.randn(2, 8, device=device), torch.randn(5, 8, device=device), gated=True)
    with pytest.raises(ValueError, match="gemv out: expected shape"):
        g.gemv(torch.randn(2, 8, device=device), torch.randn(6, 8, device=device), gated=True,
               out=torch.empty(2, 6, device=device))
    assert g.gemv(torch.randn(0, 8, device=device), torch.randn(6, 8, device=device), gated=True).shape == (0, 3)


# ---------------------------------------------------------------- GPU tests (tests/conftest.py: `device`)


PICKED = [(dtype, layer, M) for dtype in (torch.bfloat16, torch.float16) for layer in sorted(QWEN3_06B)
          for M in (1, 2, 3, 4, 5, 8, 16, 33)]
# Smoke subset: bf16 at M = 1 and 8 (the measured configs, compiled by the xrt::linear test too) and M = 3 (a
# partial FMA row tile) on every layer.
PICKED_QUICK = {(torch.bfloat16, layer, M) for layer in QWEN3_06B for M in (1, 3, 8)}


@pytest.mark.parametrize(("dtype", "layer", "M"), [
    pytest.param(*c, id=f"{c[2]}-{c[1]}-{c[0]}", marks=() if c in PICKED_QUICK else pytest.mark.slow) for c in PICKED
])
def test_picked_config_on_model_shapes(device: torch.device, dtype: torch.dtype, layer: str, M: int) -> None:
    check_gemv(device, dtype, M, *QWEN3_06B[layer])


@pytest.mark.parametrize("layer", ["qkv", "o_proj", "gate_up", "down"])  # lm_head's config is of the same kind
@pytest.mark.parametrize("M", [1, 3, 8])
def test_picked_config_on_8b_shapes(device: torch.device, layer: str, M: int) -> None:
    """The measured 8B configs (long K, split K on the dot path), M = 3 running M = 8's."""
    check_gemv(device, torch.bfloat16, M, *QWEN3_8B[layer])


@pytest.mark.slow
@pytest.mark.parametrize("layer", sorted(QWEN3_06B))
@pytest.mark.parametrize("M", [1, 4, 8])
def test_every_candidate_config_is_correct(device: torch.device, layer: str, M: int) -> None:
    """The gemv kernel bench (bench.scenario=kernels) times these; a wrong one must not win. ~90 kernel compiles on a
    cold cache."""
    N, K = QWEN3_06B[layer]
    check_configs(device, torch.bfloat16, M, N, K, gemv_module().candidate_configs(M, N, K))


ODD_SHAPES = [(1, 1, 1), (1, 37, 100), (3, 70, 129), (7, 33, 1000), (17, 50, 70), (100, 300, 200)]
# Smoke subset: a K tail on the FMA path (bf16), the dot path in fp32, more than one M tile (fp16).
ODD_QUICK = {(torch.bfloat16, (3, 70, 129)), (torch.float32, (7, 33, 1000)), (torch.float16, (17, 50, 70))}


@pytest.mark.parametrize(("dtype", "shape"), [
    pytest.param(dtype, shape, id=f"{shape}-{dtype}", marks=() if (dtype, shape) in ODD_QUICK else pytest.mark.slow)
    for dtype in DTYPES for shape in ODD_SHAPES
])
def test_odd_shapes(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    check_gemv(device, dtype, *shape)


def test_split_k_repeats(device: torch.device) -> None:
    check_split_k_repeats(device, torch.bfloat16)


def test_out_and_leading_dims(device: torch.device) -> None:
    check_out_and_leading_dims(device, torch.bfloat16)


def test_edge_cases(device: torch.device) -> None:
    check_edge_cases(device)


@pytest.mark.slow
def test_matches_torch_linear_bf16(device: torch.device) -> None:
    """Against cuBLAS in bf16 too (what the layers use today), at decode batch sizes."""
    for M in (1, 4, 16):
        for N, K in QWEN3_06B.values():
            x, w = inputs(M, N, K, torch.bfloat16, seed=M)
            x, w = x.to(device), w.to(device)
            err = rel_err(gemv_module().gemv(x, w), torch.nn.functional.linear(x, w))
            assert err < 1e-2, f"M={M} N={N} K={K}: relative error to F.linear {err:.3e}"


def test_replays_in_a_cuda_graph_after_warmup(device: torch.device) -> None:
    """Plain, FMA split-K and dot split-K launches captured once, replayed on fresh inputs: outputs track the
    inputs and the split-K counters reset on every replay."""
    g = gemv_module()
    dtype = torch.bfloat16
    cases = [(1, *QWEN3_06B["qkv"], None), (3, *QWEN3_06B["down"], g.GemvConfig(4, 2, 1024, 4, split_k=3)),
             (8, *QWEN3_06B["o_proj"], g.GemvConfig(16, 32, 256, 4, split_k=8, use_dot=True, num_stages=3))]
    static = [(torch.zeros(M, K, dtype=dtype, device=device), inputs(M, N, K, dtype)[1].to(device), cfg)
              for M, N, K, cfg in cases]
    g.warmup_gemv([(w.shape[0], w.shape[1]) for _, w, _ in static], [1, 3, 8], dtype, device)
    for x, w, cfg in static:
        g.gemv(x, w, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [g.gemv(x, w, config=cfg) for x, w, cfg in static]
    for seed in range(3):
        for i, (x, _, _) in enumerate(static):
            x.copy_(inputs(x.shape[0], 1, x.shape[1], dtype, seed=10 * seed + i)[0].to(device))
        graph.replay()
        torch.cuda.synchronize()
        for (x, w, cfg), out in zip(static, outs, strict=True):
            err = rel_err(out, reference(x, w))
            assert err < TOLERANCE[dtype], f"replay {seed} M={x.shape[0]} {cfg}: relative error {err:.3e}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layer", sorted(QWEN3_06B))
@pytest.mark.parametrize("M", [1, 2, 5, 8, 9])
def test_linear_op_on_cuda_matches_fp32_product(layer: str, M: int) -> None:
    """xrt::linear as the layers call it: the skinny kernel where prefer_gemv says so, cuBLAS otherwise."""
    import xrt.ops  # noqa: F401  (declares the ops)

    linear = torch.ops.xrt.linear

    N, K = QWEN3_06B[layer]
    x, w = inputs(M, N, K, torch.bfloat16, seed=M)
    out = linear(x.cuda(), w.cuda())
    assert rel_err(out, x.float() @ w.float().T) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("model", ["0.6b", "8b"])
@pytest.mark.parametrize("M", [1, 3, 8])
def test_gated_on_gate_up_shapes(device: torch.device, model: str, M: int) -> None:
    """The MLP's fused gate_up + activation (executor.fuse_activation) at the configs picked for gate_up."""
    N, K = (QWEN3_06B if model == "0.6b" else QWEN3_8B)["gate_up"]
    check_gated(device, torch.bfloat16, M, N // 2, K)


GATED_CONFIGS = [(1, 1, 64, 2), (4, 4, 64, 2, 4), (2, 8, 64, 2, 3), (16, 16, 32, 4, 1, True), (16, 16, 64, 4, 3, True)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("cfg", GATED_CONFIGS, ids=str)
def test_gated_odd_shapes(device: torch.device, dtype: torch.dtype, cfg: tuple) -> None:
    check_gated(device, dtype, 17, 21, 300, gemv_module().GemvConfig(*cfg))


def test_gated_edges(device: torch.device) -> None:
    check_gated_edges(device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("M", [1, 8, 9])
def test_linear_silu_and_mul_op_on_cuda(M: int) -> None:
    """xrt::linear_silu_and_mul as the MLP calls it: fused where the skinny GEMM runs gate_up, cuBLAS and the
    silu_and_mul kernel elsewhere; both against the fp32 reference."""
    import xrt.ops  # noqa: F401  (declares the ops)

    for N, K in (QWEN3_06B["gate_up"], QWEN3_8B["gate_up"]):
        x, w = inputs(M, N, K, torch.bfloat16, seed=M)
        out = torch.ops.xrt.linear_silu_and_mul(x.cuda(), w.cuda())
        assert out.shape == (M, N // 2)
        assert rel_err(out, gated_reference(x, w)) < 2 * TOLERANCE[torch.bfloat16]  # rounded three times
