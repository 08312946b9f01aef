"""The prefill's GEMMs with fused epilogues against their references in plain torch (`xrt.ops.reference`), and the
ops' CUDA routing (the kernel where it takes the input, the separate kernels elsewhere):
- xrt.kernels.qkv_gemm: the q/k norm, RoPE and KV write in the qkv GEMM's epilogue (reference: xrt::linear then
  xrt::qk_norm_rope_store_kv);
- xrt.kernels.gate_up_gemm: silu(gate) * up in the gate_up GEMM's epilogue (reference: xrt::linear then
  xrt::silu_and_mul);
- both with the layer's RMSNorm as their prologue (`norm=True`; reference: xrt::rms_norm first);
- xrt.kernels.residual_gemm: the residual add in o_proj's and down's epilogue (reference: xrt::linear, then the add).
The checks are device-agnostic, so test_prefill_gemm_interpret.py runs them on CPU under TRITON_INTERPRET=1 with
small tiles; the kernel modules are imported inside them (collecting this file never imports triton)."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from xrt.bench.kernels import elementwise
from xrt.ops import reference

EPS = 1e-6
# Max |out - ref| / max |ref|. The GEMM sums in another order than torch.mm, so a head's rounded values (and
# through its norm the whole head) may differ by an ulp of bf16.
TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 4e-3}


def rope_cache(max_pos: int, head_dim: int) -> torch.Tensor:
    """The layers' cos / sin table on CPU (the kernels scenario's builder of it), Qwen3's theta."""
    return elementwise.rope_cache(head_dim, 1e6, max_pos, torch.device("cpu"))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().cpu().float(), ref.detach().cpu().float()
    assert torch.isfinite(out).all(), "non-finite values"
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def activations(gen: torch.Generator, n_tokens: int, hidden: int, dtype: torch.dtype, norm: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [T, hidden] and, with norm, an RMSNorm weight for it: then x's rows have RMS ~4 to 12 (a residual
    stream's scale), so a missing or misplaced 1 / RMS shows."""
    if not norm:
        return torch.randn(n_tokens, hidden, generator=gen).to(dtype), None
    x = torch.randn(n_tokens, hidden, generator=gen) * (4 + 8 * torch.rand(n_tokens, 1, generator=gen))
    return x.to(dtype), (torch.rand(hidden, generator=gen) + 0.5).to(dtype)


def check_linear_qk_norm_rope_store_kv(
    device: torch.device, dtype: torch.dtype, n_tokens: int, heads: int, kv_heads: int, head_dim: int, hidden: int,
    page_size: int, seed: int = 0, norm: bool = False, **tiles: int,
) -> None:
    """One launch on random inputs (weights scaled as a checkpoint's, so the products stay O(1); about 1 slot in
    4 is -1), against the reference on CPU: qkv, the written cache slots, and every other slot untouched. norm:
    with the RMSNorm prologue."""
    qkv_gemm = importlib.import_module("xrt.kernels.qkv_gemm")
    gen = torch.Generator().manual_seed(seed)
    width = (heads + 2 * kv_heads) * head_dim
    x, norm_w = activations(gen, n_tokens, hidden, dtype, norm)
    w = (torch.randn(width, hidden, generator=gen) / math.sqrt(hidden)).to(dtype)
    q_w = (torch.randn(head_dim, generator=gen) * 0.5 + 1).to(dtype)
    k_w = (torch.randn(head_dim, generator=gen) * 0.5 + 1).to(dtype)
    cos_sin = rope_cache(4096, head_dim)
    positions = torch.randint(0, 4096, (n_tokens,), generator=gen, dtype=torch.int64)
    num_pages = math.ceil(n_tokens / page_size) + 2
    cache = torch.randn(num_pages, 2, page_size, kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(num_pages * page_size, generator=gen)[:n_tokens]
    slots = torch.where(torch.rand(n_tokens, generator=gen) < 0.25, -1, slots)
    dims = (heads, kv_heads, head_dim, EPS)

    cache_dev = cache.to(device, copy=True)
    out = qkv_gemm.linear_qk_norm_rope_store_kv(
        x.to(device), w.to(device), q_w.to(device), k_w.to(device), cos_sin.to(device), positions.to(device),
        cache_dev, slots.to(device), *dims, None if norm_w is None else norm_w.to(device), **tiles)
    ref_cache = cache.clone()
    ref = reference.linear_qk_norm_rope_store_kv(x, w, q_w, k_w, cos_sin, positions, ref_cache, slots, *dims,
                                                 norm_w)
    what = f"{dtype} T={n_tokens} H={heads} KV={kv_heads} D={head_dim} K={hidden} page={page_size} norm={norm}"
    assert out.shape == ref.shape and out.dtype == dtype, what
    err = rel_err(out, ref)
    assert err < TOLERANCE[dtype], f"{what} qkv: relative error {err:.3e}"
    err = rel_err(cache_dev, ref_cache)
    assert err < TOLERANCE[dtype], f"{what} cache: relative error {err:.3e}"
    untouched = torch.ones(num_pages * page_size, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    flat = cache_dev.cpu().transpose(1, 2).reshape(num_pages * page_size, -1)
    assert torch.equal(flat[untouched], cache.transpose(1, 2).reshape(num_pages * page_size, -1)[untouched]), (
        f"{what}: wrote outside slot_mapping")


def check_linear_silu_and_mul(device: torch.device, dtype: torch.dtype, n_tokens: int, inter: int, hidden: int,
                              seed: int = 0, norm: bool = False, **tiles: int) -> None:
    """One launch on random inputs (weights scaled as a checkpoint's) against the reference on CPU. norm: with the
    RMSNorm prologue."""
    gate_up_gemm = importlib.import_module("xrt.kernels.gate_up_gemm")
    gen = torch.Generator().manual_seed(seed)
    x, norm_w = activations(gen, n_tokens, hidden, dtype, norm)
    w = (torch.randn(2 * inter, hidden, generator=gen) / math.sqrt(hidden)).to(dtype)
    out = gate_up_gemm.linear_silu_and_mul(x.to(device), w.to(device), None if norm_w is None else norm_w.to(device),
                                           EPS, **tiles)
    ref = reference.linear_silu_and_mul(x, w, None, norm_w, EPS)
    assert out.shape == ref.shape == (n_tokens, inter) and out.dtype == dtype
    err = rel_err(out, ref)
    assert err < TOLERANCE[dtype], (f"linear_silu_and_mul {dtype} T={n_tokens} I={inter} K={hidden} norm={norm}: "
                                    f"{err:.3e}")


def check_linear_add(device: torch.device, dtype: torch.dtype, n_tokens: int, out_features: int, in_features: int,
                     seed: int = 0, **tiles: int) -> None:
    """One launch on random inputs (a residual stream of RMS ~4, weights scaled as a checkpoint's) against the
    reference on CPU."""
    residual_gemm = importlib.import_module("xrt.kernels.residual_gemm")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, in_features, generator=gen).to(dtype)
    w = (torch.randn(out_features, in_features, generator=gen) / math.sqrt(in_features)).to(dtype)
    res = (torch.randn(n_tokens, out_features, generator=gen) * 4).to(dtype)
    out = residual_gemm.linear_add(x.to(device), w.to(device), res.to(device), **tiles)
    ref = reference.linear_add(x, w, res)
    assert out.shape == ref.shape == (n_tokens, out_features) and out.dtype == dtype
    err = rel_err(out, ref)
    assert err < TOLERANCE[dtype], f"linear_add {dtype} T={n_tokens} N={out_features} K={in_features}: {err:.3e}"


SHAPES = [
    # tokens, heads, kv heads, head_dim, hidden, page size: Qwen3-0.6B at a prefill graph bucket and an odd
    # count, Qwen3-8B, and a 1-token launch
    pytest.param(1024, 16, 8, 128, 1024, 16, id="0.6b-1024"),
    pytest.param(1000, 16, 8, 128, 1024, 16, id="0.6b-1000"),
    pytest.param(333, 32, 8, 128, 4096, 16, id="8b-333", marks=pytest.mark.slow),
    pytest.param(1, 16, 8, 128, 1024, 16, id="0.6b-1", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)], ids=str)
@pytest.mark.parametrize(("n_tokens", "heads", "kv_heads", "head_dim", "hidden", "page_size"), SHAPES)
def test_linear_qk_norm_rope_store_kv(device: torch.device, dtype: torch.dtype, n_tokens: int, heads: int,
                                      kv_heads: int, head_dim: int, hidden: int, page_size: int) -> None:
    check_linear_qk_norm_rope_store_kv(device, dtype, n_tokens, heads, kv_heads, head_dim, hidden, page_size)


@pytest.mark.parametrize("variant", [{"one_dot": False}, {"tma": True}], ids=["dot-per-half", "tma"])
def test_linear_qk_norm_rope_store_kv_variants(device: torch.device, variant: dict) -> None:
    """The kernel bench's other ways of computing the same tile: a dot per half, tensor-descriptor (TMA) loads."""
    check_linear_qk_norm_rope_store_kv(device, torch.bfloat16, 1000, 16, 8, 128, 1024, 16, **variant)


@pytest.mark.parametrize("variant", [{}, {"one_dot": False}, {"tma": True}], ids=["one-dot", "dot-per-half", "tma"])
@pytest.mark.parametrize(("n_tokens", "heads", "kv_heads", "hidden"), [
    pytest.param(1000, 16, 8, 1024, id="0.6b-1000"), pytest.param(333, 32, 8, 4096, id="8b-333")])
def test_linear_qk_norm_rope_store_kv_norm_prologue(device: torch.device, variant: dict, n_tokens: int, heads: int,
                                                    kv_heads: int, hidden: int) -> None:
    """With the layer's input RMSNorm as the GEMM's prologue (executor.fuse_prefill_norms), every variant."""
    check_linear_qk_norm_rope_store_kv(device, torch.bfloat16, n_tokens, heads, kv_heads, 128, hidden, 16,
                                       norm=True, **variant)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)], ids=str)
@pytest.mark.parametrize(("n_tokens", "inter", "hidden"), [
    pytest.param(1024, 3072, 1024, id="0.6b-1024"), pytest.param(1000, 3072, 1024, id="0.6b-1000"),
    pytest.param(333, 12288, 4096, id="8b-333", marks=pytest.mark.slow),
    pytest.param(9, 100, 128, id="odd-intermediate", marks=pytest.mark.slow)])
def test_linear_silu_and_mul(device: torch.device, dtype: torch.dtype, n_tokens: int, inter: int,
                             hidden: int) -> None:
    check_linear_silu_and_mul(device, dtype, n_tokens, inter, hidden)


def test_linear_silu_and_mul_tma(device: torch.device) -> None:
    """The kernel bench's tensor-descriptor (TMA) variant computes the same."""
    check_linear_silu_and_mul(device, torch.bfloat16, 1000, 3072, 1024, tma=True)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize(("n_tokens", "inter", "hidden"), [
    pytest.param(1000, 3072, 1024, id="0.6b-1000"), pytest.param(333, 12288, 4096, id="8b-333")])
def test_linear_silu_and_mul_norm_prologue(device: torch.device, tma: bool, n_tokens: int, inter: int,
                                           hidden: int) -> None:
    """With the post-attention RMSNorm as the GEMM's prologue (executor.fuse_prefill_norms)."""
    check_linear_silu_and_mul(device, torch.bfloat16, n_tokens, inter, hidden, norm=True, tma=tma)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)], ids=str)
@pytest.mark.parametrize(("n_tokens", "out_features", "in_features"), [
    # 0.6B at ~1k tokens: fewer 128 x 128 tiles than SMs, so the small tile; at 4096 tokens the large one
    pytest.param(1024, 1024, 2048, id="0.6b-o_proj-1024"), pytest.param(1000, 1024, 3072, id="0.6b-down-1000"),
    pytest.param(4096, 1024, 3072, id="0.6b-down-4096"),
    pytest.param(333, 4096, 12288, id="8b-down-333", marks=pytest.mark.slow),
    pytest.param(9, 100, 128, id="odd-output", marks=pytest.mark.slow)])
def test_linear_add(device: torch.device, dtype: torch.dtype, n_tokens: int, out_features: int,
                    in_features: int) -> None:
    check_linear_add(device, dtype, n_tokens, out_features, in_features)


def test_linear_add_tma(device: torch.device) -> None:
    """The kernel bench's tensor-descriptor (TMA) variant computes the same."""
    check_linear_add(device, torch.bfloat16, 1000, 1024, 3072, tma=True)


def kernel_calls(monkeypatch: pytest.MonkeyPatch, module: str, function: str) -> list[int]:
    """The row counts the op's CUDA routing hands `xrt.kernels.<module>.<function>`, appended as the wrapped kernel
    runs (the CUDA implementations registered first)."""
    kernels = importlib.import_module(f"xrt.kernels.{module}")
    import xrt.ops  # noqa: F401  (registers the CUDA implementations)

    calls: list[int] = []
    real = getattr(kernels, function)
    monkeypatch.setattr(kernels, function, lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    return calls


def test_linear_silu_and_mul_runs_the_kernel_past_the_skinny_batches(device: torch.device,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.ops.xrt.linear_silu_and_mul on CUDA: the gate_up GEMM kernel above 8 rows for 16-bit inputs; the skinny
    GEMM or cuBLAS + silu_and_mul at 8 rows and below, and for fp32; the same values each way."""
    calls = kernel_calls(monkeypatch, "gate_up_gemm", "linear_silu_and_mul")
    gen = torch.Generator().manual_seed(1)
    for norm in (False, True):
        for dtype, rows, fused in ((torch.bfloat16, 9, True), (torch.bfloat16, 8, False),
                                   (torch.float32, 40, False)):
            x, norm_w = activations(gen, rows, 1024, dtype, norm)
            w = (torch.randn(6144, 1024, generator=gen) / 32).to(dtype)
            before = len(calls)
            out = torch.ops.xrt.linear_silu_and_mul(x.to(device), w.to(device), None,
                                                    None if norm_w is None else norm_w.to(device), EPS)
            assert (len(calls) > before) == fused, (dtype, rows, norm)
            tol = 1e-5 if dtype == torch.float32 else 1.6e-2
            assert rel_err(out, reference.linear_silu_and_mul(x, w, None, norm_w, EPS)) < tol, (dtype, rows, norm)


def test_linear_add_runs_the_kernel_past_the_skinny_batches(device: torch.device,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.ops.xrt.linear_add on CUDA: the residual GEMM kernel above 8 rows for 16-bit inputs; xrt::linear and an
    add at 8 rows and below, and for fp32; the same values each way."""
    calls = kernel_calls(monkeypatch, "residual_gemm", "linear_add")
    gen = torch.Generator().manual_seed(2)
    for dtype, rows, fused in ((torch.bfloat16, 9, True), (torch.bfloat16, 8, False), (torch.float32, 40, False)):
        x = torch.randn(rows, 2048, generator=gen).to(dtype)
        w = (torch.randn(1024, 2048, generator=gen) / 45).to(dtype)
        res = (torch.randn(rows, 1024, generator=gen) * 4).to(dtype)
        before = len(calls)
        out = torch.ops.xrt.linear_add(x.to(device), w.to(device), res.to(device))
        assert (len(calls) > before) == fused, (dtype, rows)
        tol = 1e-5 if dtype == torch.float32 else 1.6e-2
        assert rel_err(out, reference.linear_add(x, w, res)) < tol, (dtype, rows)


def test_the_op_runs_the_kernel_where_it_takes_the_shape(device: torch.device,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.ops.xrt.linear_qk_norm_rope_store_kv on CUDA: the fused kernel for a 16-bit head of 128, xrt::linear
    and the qk_norm_rope_store_kv kernel for what it does not take (head_dim 16, fp32); the same values each way."""
    calls = kernel_calls(monkeypatch, "qkv_gemm", "linear_qk_norm_rope_store_kv")
    for dtype, head_dim, fused in ((torch.bfloat16, 128, True), (torch.bfloat16, 16, False),
                                   (torch.float32, 128, False)):
        gen = torch.Generator().manual_seed(head_dim)
        heads, kv_heads, hidden, t = 4, 2, 256, 40
        x = torch.randn(t, hidden, generator=gen).to(dtype)
        w = (torch.randn((heads + 2 * kv_heads) * head_dim, hidden, generator=gen) / 16).to(dtype)
        ones = torch.ones(head_dim, dtype=dtype)
        cos_sin = rope_cache(64, head_dim)
        pos = torch.arange(t) % 64
        cache = torch.zeros(8, 2, 16, kv_heads, head_dim, dtype=dtype)
        slots = torch.arange(t)
        dev = [v.to(device) for v in (x, w, ones, ones, cos_sin, pos, cache, slots)]
        before = len(calls)
        out = torch.ops.xrt.linear_qk_norm_rope_store_kv(*dev, heads, kv_heads, head_dim, EPS)
        assert (len(calls) > before) == fused, (dtype, head_dim)
        ref = reference.linear_qk_norm_rope_store_kv(x, w, ones, ones, cos_sin, pos, cache, slots, heads, kv_heads,
                                                     head_dim, EPS)
        tol = 1e-5 if dtype == torch.float32 else 1.6e-2
        assert rel_err(out, ref) < tol and rel_err(dev[6], cache) < tol, (dtype, head_dim)


def test_the_kernel_rejects_what_it_does_not_take(device: torch.device) -> None:
    """A clear error naming the argument, not a wrong result: fp32, a head of 16, a hidden size off the K step."""
    qkv_gemm = importlib.import_module("xrt.kernels.qkv_gemm")
    cache = torch.zeros(2, 2, 16, 1, 128, dtype=torch.bfloat16, device=device)
    one = torch.zeros(3, dtype=torch.int64, device=device)
    cs = torch.zeros(8, 128, device=device)
    w128 = torch.ones(128, dtype=torch.bfloat16, device=device)
    for x, w in ((torch.zeros(3, 64, device=device), torch.zeros(384, 64, device=device)),
                 (torch.zeros(3, 96, dtype=torch.bfloat16, device=device),
                  torch.zeros(384, 96, dtype=torch.bfloat16, device=device))):
        with pytest.raises(ValueError, match="linear_qk_norm_rope_store_kv"):
            qkv_gemm.linear_qk_norm_rope_store_kv(x, w, w128, w128, cs, one, cache, one, 1, 1, 128, EPS)
