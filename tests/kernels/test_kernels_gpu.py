"""Each Triton kernel against its CPU reference (xrt.ops.reference) on fresh random inputs.

Tensors a kernel mutates are copied to the device (`copy=True`: on CPU `.to` would alias the input the
reference then reads). The check_* functions are device-agnostic so test_kernels_interpret.py can
run the same checks on CPU under TRITON_INTERPRET=1. Kernel modules are imported inside the checks (not at
module level), so collecting this file never imports triton and never fixes the interpreter mode too early."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import pytest
import torch

from xrt.ops import reference

# Max |out - ref| / max |ref|: a 1-ulp rounding difference in bf16 is ~4e-3 of the value.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EPS = 1e-6


def kernel(module: str, name: str) -> Callable:
    return getattr(importlib.import_module(f"xrt.kernels.{module}"), name)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().cpu().float(), ref.detach().cpu().float()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "kernel produced non-finite values"
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    err = rel_err(out, ref)
    assert err < TOLERANCE[dtype], f"{what}: relative error {err:.3e} >= {TOLERANCE[dtype]:.0e}"


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def rope_cache(max_pos: int, head_dim: int, theta: float = 1e6) -> torch.Tensor:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


def random_slots(gen: torch.Generator, n_tokens: int, num_pages: int, page_size: int) -> torch.Tensor:
    """Distinct slots spread over all pages (so page boundaries are crossed), about 1 in 4 set to -1."""
    assert n_tokens <= num_pages * page_size
    slots = torch.randperm(num_pages * page_size, generator=gen)[:n_tokens]
    skip = torch.rand(n_tokens, generator=gen) < 0.25
    return torch.where(skip, torch.full_like(slots, -1), slots).to(torch.int64)


def check_rms_norm(device: torch.device, dtype: torch.dtype, n_tokens: int, hidden: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, n_tokens, hidden, dtype=dtype, scale=3.0)
    w = randn(gen, hidden, dtype=dtype)
    out = kernel("rms_norm", "rms_norm")(x.to(device), w.to(device), EPS)
    assert out.dtype == dtype and out.device.type == torch.device(device).type
    assert_close(out, reference.rms_norm(x, w, EPS), dtype, f"rms_norm {dtype} [{n_tokens}, {hidden}]")


def check_fused_add_rms_norm(
    device: torch.device, dtype: torch.dtype, n_tokens: int, hidden: int, seed: int = 0
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, res = randn(gen, n_tokens, hidden, dtype=dtype), randn(gen, n_tokens, hidden, dtype=dtype, scale=4.0)
    w = randn(gen, hidden, dtype=dtype)
    x_dev, res_dev = x.to(device, copy=True), res.to(device, copy=True)
    kernel("rms_norm", "fused_add_rms_norm")(x_dev, res_dev, w.to(device), EPS)
    x_ref, res_ref = x.clone(), res.clone()
    reference.fused_add_rms_norm(x_ref, res_ref, w, EPS)
    assert_close(res_dev, res_ref, dtype, f"fused_add_rms_norm residual {dtype} [{n_tokens}, {hidden}]")
    assert_close(x_dev, x_ref, dtype, f"fused_add_rms_norm x {dtype} [{n_tokens}, {hidden}]")


def check_silu_and_mul(device: torch.device, dtype: torch.dtype, n_tokens: int, inter: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, n_tokens, 2 * inter, dtype=dtype, scale=2.0)
    out = kernel("silu_and_mul", "silu_and_mul")(x.to(device))
    assert_close(out, reference.silu_and_mul(x), dtype, f"silu_and_mul {dtype} [{n_tokens}, {2 * inter}]")


def _qk_inputs(
    gen: torch.Generator, dtype: torch.dtype, n_tokens: int, heads: int, kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    max_pos = 4096
    qkv = randn(gen, n_tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, scale=2.0)
    q_w = randn(gen, head_dim, dtype=dtype, scale=0.5) + 1
    k_w = randn(gen, head_dim, dtype=dtype, scale=0.5) + 1
    positions = torch.randint(0, max_pos, (n_tokens,), generator=gen, dtype=torch.int64)
    return qkv, q_w, k_w, rope_cache(max_pos, head_dim), positions


def check_qk_norm_rope(
    device: torch.device, dtype: torch.dtype, n_tokens: int, heads: int, kv_heads: int, head_dim: int, seed: int = 0
) -> None:
    gen = torch.Generator().manual_seed(seed)
    qkv, q_w, k_w, cos_sin, positions = _qk_inputs(gen, dtype, n_tokens, heads, kv_heads, head_dim)
    qkv_dev = qkv.to(device, copy=True)
    dims = (heads, kv_heads, head_dim, EPS)
    kernel("qk_norm_rope", "qk_norm_rope")(
        qkv_dev, q_w.to(device), k_w.to(device), cos_sin.to(device), positions.to(device), *dims
    )
    ref = qkv.clone()
    reference.qk_norm_rope(ref, q_w, k_w, cos_sin, positions, *dims)
    v_start = (heads + kv_heads) * head_dim
    what = f"qk_norm_rope {dtype} T={n_tokens} H={heads} KV={kv_heads} D={head_dim}"
    assert_close(qkv_dev[:, :v_start], ref[:, :v_start], dtype, what)
    assert torch.equal(qkv_dev[:, v_start:].cpu(), qkv[:, v_start:]), f"{what}: v heads changed"


def check_qk_norm_rope_store_kv(
    device: torch.device,
    dtype: torch.dtype,
    n_tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    seed: int = 0,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    qkv, q_w, k_w, cos_sin, positions = _qk_inputs(gen, dtype, n_tokens, heads, kv_heads, head_dim)
    num_pages = math.ceil(n_tokens / page_size) + 2
    cache = randn(gen, num_pages, 2, page_size, kv_heads, head_dim, dtype=dtype)
    slots = random_slots(gen, n_tokens, num_pages, page_size)
    qkv_dev, cache_dev = qkv.to(device, copy=True), cache.to(device, copy=True)
    dims = (heads, kv_heads, head_dim, EPS)
    kernel("qk_norm_rope", "qk_norm_rope_store_kv")(
        qkv_dev, q_w.to(device), k_w.to(device), cos_sin.to(device), positions.to(device),
        cache_dev, slots.to(device), *dims,
    )
    ref, ref_cache = qkv.clone(), cache.clone()
    reference.qk_norm_rope_store_kv(ref, q_w, k_w, cos_sin, positions, ref_cache, slots, *dims)
    what = f"qk_norm_rope_store_kv {dtype} T={n_tokens} H={heads} KV={kv_heads} D={head_dim} page={page_size}"
    assert_close(qkv_dev, ref, dtype, what + " qkv")
    assert_close(cache_dev, ref_cache, dtype, what + " cache")
    untouched = torch.ones(num_pages * page_size, dtype=torch.bool)
    untouched[slots[slots >= 0]] = False
    flat = cache_dev.cpu().transpose(1, 2).reshape(num_pages * page_size, 2, kv_heads, head_dim)
    expect = cache.transpose(1, 2).reshape(num_pages * page_size, 2, kv_heads, head_dim)
    assert torch.equal(flat[untouched], expect[untouched]), f"{what}: wrote outside slot_mapping"


def check_store_kv(
    device: torch.device,
    dtype: torch.dtype,
    n_tokens: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    seed: int = 0,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_pages = math.ceil(n_tokens / page_size) + 2
    # k and v as strided views of a packed qkv, the way the attention layer passes them.
    qkv = randn(gen, n_tokens, 3 * kv_heads * head_dim, dtype=dtype)
    cache = randn(gen, num_pages, 2, page_size, kv_heads, head_dim, dtype=dtype)
    slots = random_slots(gen, n_tokens, num_pages, page_size)
    kv_size = kv_heads * head_dim

    def split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (t[:, kv_size:2 * kv_size].view(n_tokens, kv_heads, head_dim),
                t[:, 2 * kv_size:].view(n_tokens, kv_heads, head_dim))

    cache_dev = cache.to(device, copy=True)
    kernel("store_kv", "store_kv")(*split(qkv.to(device)), cache_dev, slots.to(device))
    ref_cache = cache.clone()
    reference.store_kv(*split(qkv), ref_cache, slots)
    # A copy: exact, including the slots that must stay untouched.
    assert torch.equal(cache_dev.cpu(), ref_cache), f"store_kv {dtype} T={n_tokens} page={page_size}: cache differs"


def check_argmax_rows(device: torch.device, dtype: torch.dtype, rows: int, vocab: int, seed: int = 0) -> None:
    """The greedy token of each row, equal to torch.argmax's: random rows, and rows whose maximum repeats within
    and across the kernel's chunks (the first wins), -0.0 against +0.0, NaN (the first NaN wins) and all -inf."""
    gen = torch.Generator().manual_seed(seed)
    x = randn(gen, rows, vocab, dtype=dtype, scale=3.0)
    special = []
    if rows > 1 and vocab > 8:
        top = x[1].max() + 1
        x[1, [vocab - 1, vocab // 2, 5]] = top  # repeats in the last, a middle and the first chunk
        special.append(1)
    if rows > 2 and vocab > 8:
        x[2] = float("-inf")
        x[2, vocab - 2] = -0.0
        x[2, vocab - 1] = 0.0  # equal to -0.0: the first of the two wins
        special.append(2)
    if rows > 3 and vocab > 8:
        x[3, [vocab - 3, 7]] = float("nan")
        x[3, 0] = float("inf")
        special.append(3)
    if rows > 4:
        x[4] = float("-inf")
        special.append(4)
    out = torch.full((rows,), -1, dtype=torch.int64, device=device)
    kernel("argmax", "argmax_rows")(x.to(device), out)
    ref = torch.empty(rows, dtype=torch.int64)
    reference.argmax_rows(x, ref)
    assert torch.equal(out.cpu(), ref), f"argmax_rows {dtype} [{rows}, {vocab}] rows {special}"


def check_layouts(device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Inputs that are not plain contiguous [T, N]: row-strided views, extra leading dims, transposes."""
    gen = torch.Generator().manual_seed(4)
    w = randn(gen, 64, dtype=dtype)
    wide = randn(gen, 5, 100, dtype=dtype)
    inputs = {"row view": wide[:, 10:74], "3d": randn(gen, 2, 3, 64, dtype=dtype),
              "transposed": randn(gen, 64, 6, dtype=dtype).t()}
    for what, x in inputs.items():
        out = kernel("rms_norm", "rms_norm")(x.to(device), w.to(device), EPS)
        assert_close(out, reference.rms_norm(x, w, EPS), dtype, f"rms_norm {what}")
    gu = randn(gen, 2, 3, 96, dtype=dtype)
    assert_close(kernel("silu_and_mul", "silu_and_mul")(gu.to(device)), reference.silu_and_mul(gu), dtype, "silu 3d")
    # In place on row-strided views: only the viewed columns may change.
    x_wide, r_wide = randn(gen, 5, 100, dtype=dtype), randn(gen, 5, 80, dtype=dtype)
    x_dev, r_dev = x_wide.to(device, copy=True), r_wide.to(device, copy=True)
    kernel("rms_norm", "fused_add_rms_norm")(x_dev[:, 10:74], r_dev[:, 16:], w.to(device), EPS)
    reference.fused_add_rms_norm(x_wide[:, 10:74], r_wide[:, 16:], w, EPS)
    assert_close(x_dev, x_wide, dtype, "fused_add_rms_norm x row view")
    assert_close(r_dev, r_wide, dtype, "fused_add_rms_norm residual row view")
    assert torch.equal(x_dev[:, :10].cpu(), x_wide[:, :10]) and torch.equal(r_dev[:, :16].cpu(), r_wide[:, :16])


# 0.6B shapes: hidden 1024, heads 16, kv 8, head_dim 128, intermediate 3072.
NORM_SHAPES = [(1, 1024), (7, 1024), (33, 1000), (5, 64), (130, 4096)]
SILU_SHAPES = [(1, 3072), (9, 3072), (3, 100), (16, 128)]
# qk: heads + kv_heads below, at and above one program's HEAD_BLOCK (8), and a prefill-sized token count.
QK_SHAPES = [(1, 16, 8, 128), (7, 16, 8, 128), (5, 4, 2, 16), (3, 3, 3, 6), (64, 16, 8, 128), (9, 5, 1, 64),
             (1024, 16, 8, 128), (4, 32, 8, 128)]
STORE_SHAPES = [(1, 8, 128, 16), (7, 8, 128, 16), (37, 8, 128, 16), (19, 2, 16, 4), (5, 3, 6, 1)]
FUSED_SHAPES = [(1, 16, 8, 128, 16), (37, 16, 8, 128, 16), (11, 4, 2, 16, 4), (5, 3, 3, 6, 1), (1024, 16, 8, 128, 16),
                (6, 14, 2, 32, 2)]


def cases(shapes: list[tuple[int, ...]], *quick: tuple[torch.dtype, tuple[int, ...]]) -> list:
    """Every (dtype, shape) of DTYPES x shapes. Only the `quick` ones are in the smoke subset (`-m "not slow"`):
    bf16 at a Qwen3-0.6B shape (the specialization the model, the dispatch and the graph tests use too) and an
    odd shape in another dtype. Triton compiles each (dtype, width) once, ~0.5-1 s on a cold cache."""
    return [
        pytest.param(dtype, shape, id=f"{str(dtype).removeprefix('torch.')}-{shape}",
                     marks=() if (dtype, shape) in quick else pytest.mark.slow)
        for shape in shapes for dtype in DTYPES
    ]


@pytest.mark.parametrize(("dtype", "shape"), cases(NORM_SHAPES, (torch.bfloat16, (7, 1024)),
                                                   (torch.float32, (33, 1000))))
def test_rms_norm(device: torch.device, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    check_rms_norm(device, dtype, *shape)


@pytest.mark.parametrize(("dtype", "shape"), cases(NORM_SHAPES, (torch.bfloat16, (7, 1024)),
                                                   (torch.float16, (33, 1000))))
def test_fused_add_rms_norm(device: torch.device, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    check_fused_add_rms_norm(device, dtype, *shape)


@pytest.mark.parametrize(("dtype", "shape"), cases(SILU_SHAPES, (torch.bfloat16, (9, 3072)), (torch.float32, (3, 100))))
def test_silu_and_mul(device: torch.device, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    check_silu_and_mul(device, dtype, *shape)


@pytest.mark.parametrize(("dtype", "shape"), cases(QK_SHAPES, (torch.bfloat16, (7, 16, 8, 128)),
                                                   (torch.float16, (3, 3, 3, 6))))
def test_qk_norm_rope(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> None:
    check_qk_norm_rope(device, dtype, *shape)


@pytest.mark.parametrize(("dtype", "shape"), cases(FUSED_SHAPES, (torch.bfloat16, (37, 16, 8, 128, 16)),
                                                   (torch.float32, (5, 3, 3, 6, 1))))
def test_qk_norm_rope_store_kv(device: torch.device, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    check_qk_norm_rope_store_kv(device, dtype, *shape)


@pytest.mark.parametrize(("dtype", "shape"), cases(STORE_SHAPES, (torch.bfloat16, (37, 8, 128, 16)),
                                                   (torch.float16, (5, 3, 6, 1))))
def test_store_kv(device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> None:
    check_store_kv(device, dtype, *shape)


ARGMAX_SHAPES = [(1, 151936), (5, 151936), (3, 1000), (6, 4097), (2, 3)]


@pytest.mark.parametrize(("dtype", "shape"), cases(ARGMAX_SHAPES, (torch.bfloat16, (5, 151936)),
                                                   (torch.float32, (6, 4097))))
def test_argmax_rows(device: torch.device, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    check_argmax_rows(device, dtype, *shape)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)], ids=str)
def test_layouts(device: torch.device, dtype: torch.dtype) -> None:
    check_layouts(device, dtype)


def test_empty_batch_is_a_no_op(device: torch.device) -> None:
    x = torch.empty(0, 64, device=device)
    assert kernel("rms_norm", "rms_norm")(x, torch.ones(64, device=device), EPS).shape == (0, 64)
    assert kernel("silu_and_mul", "silu_and_mul")(torch.empty(0, 128, device=device)).shape == (0, 64)
    cache = torch.randn(2, 2, 4, 2, 16, device=device)
    before = cache.clone()
    empty_kv = torch.empty(0, 2, 16, device=device)
    kernel("store_kv", "store_kv")(empty_kv, empty_kv, cache, torch.empty(0, dtype=torch.int64, device=device))
    assert torch.equal(cache, before)


def test_ops_dispatch_to_the_triton_kernels(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    import xrt.ops  # noqa: F401  (registers xrt.ops.cuda_impls when CUDA is present)

    calls: list[str] = []
    for module, name in [("rms_norm", "rms_norm"), ("rms_norm", "fused_add_rms_norm"), ("silu_and_mul", "silu_and_mul"),
                         ("qk_norm_rope", "qk_norm_rope"), ("store_kv", "store_kv"),
                         ("qk_norm_rope", "qk_norm_rope_store_kv")]:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"xrt::{name}", "CUDA"), f"xrt::{name} has no CUDA kernel"
        real = kernel(module, name)

        def spy(*args: object, _real: Callable = real, _name: str = name) -> object:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(importlib.import_module(f"xrt.kernels.{module}"), name, spy)

    dtype, gen = torch.bfloat16, torch.Generator().manual_seed(1)
    x, w = randn(gen, 5, 1024, dtype=dtype), randn(gen, 1024, dtype=dtype)
    assert_close(torch.ops.xrt.rms_norm(x.to(device), w.to(device), EPS), reference.rms_norm(x, w, EPS), dtype, "op")
    res = randn(gen, 5, 1024, dtype=dtype)
    x_dev, res_dev = x.to(device, copy=True), res.to(device, copy=True)
    torch.ops.xrt.fused_add_rms_norm(x_dev, res_dev, w.to(device), EPS)
    reference.fused_add_rms_norm(x, res, w, EPS)
    assert_close(x_dev, x, dtype, "op fused_add_rms_norm x")
    assert_close(res_dev, res, dtype, "op fused_add_rms_norm residual")
    gu = randn(gen, 5, 2 * 3072, dtype=dtype)
    assert_close(torch.ops.xrt.silu_and_mul(gu.to(device)), reference.silu_and_mul(gu), dtype, "op silu_and_mul")
    qkv, q_w, k_w, cos_sin, positions = _qk_inputs(gen, dtype, 5, 16, 8, 128)
    qkv_dev = qkv.to(device, copy=True)
    torch.ops.xrt.qk_norm_rope(qkv_dev, q_w.to(device), k_w.to(device), cos_sin.to(device), positions.to(device),
                               16, 8, 128, EPS)
    reference.qk_norm_rope(qkv, q_w, k_w, cos_sin, positions, 16, 8, 128, EPS)
    assert_close(qkv_dev, qkv, dtype, "op qk_norm_rope")
    cache = randn(gen, 3, 2, 16, 8, 128, dtype=dtype)
    slots = random_slots(gen, 5, 3, 16)
    cache_dev = cache.to(device, copy=True)
    k, v = qkv[:, 2048:3072].view(5, 8, 128), qkv[:, 3072:].view(5, 8, 128)
    torch.ops.xrt.store_kv(k.to(device), v.to(device), cache_dev, slots.to(device))
    reference.store_kv(k, v, cache, slots)
    assert torch.equal(cache_dev.cpu(), cache), "op store_kv"
    qkv_dev, cache_dev = qkv.to(device, copy=True), cache.to(device, copy=True)
    torch.ops.xrt.qk_norm_rope_store_kv(qkv_dev, q_w.to(device), k_w.to(device), cos_sin.to(device),
                                        positions.to(device), cache_dev, slots.to(device), 16, 8, 128, EPS)
    reference.qk_norm_rope_store_kv(qkv, q_w, k_w, cos_sin, positions, cache, slots, 16, 8, 128, EPS)
    assert_close(qkv_dev, qkv, dtype, "op qk_norm_rope_store_kv qkv")
    assert_close(cache_dev, cache, dtype, "op qk_norm_rope_store_kv cache")
    assert calls == ["rms_norm", "fused_add_rms_norm", "silu_and_mul", "qk_norm_rope", "store_kv",
                     "qk_norm_rope_store_kv"]


def test_argmax_op_runs_the_kernel_and_replays_in_a_cuda_graph(device: torch.device,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """xrt::argmax_rows on CUDA is the Triton kernel; captured after one eager launch (its scratch allocated then),
    every replay over new logits gives torch.argmax's tokens: the arrival counters reset themselves."""
    import xrt.kernels.argmax as argmax_module
    import xrt.ops  # noqa: F401

    calls: list[int] = []
    real = argmax_module.argmax_rows
    monkeypatch.setattr(argmax_module, "argmax_rows", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(3)
    logits = randn(gen, 4, 151936, dtype=torch.bfloat16).to(device)
    out = torch.empty(4, dtype=torch.int64, device=device)
    torch.ops.xrt.argmax_rows(logits, out, True)
    assert calls == [1] and torch.equal(out, logits.argmax(dim=-1))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.xrt.argmax_rows(logits, out, True)
    for _ in range(3):
        logits.copy_(randn(gen, 4, 151936, dtype=torch.bfloat16).to(device))
        graph.replay()
        assert torch.equal(out, logits.argmax(dim=-1))


def test_kernels_replay_in_a_cuda_graph_after_warmup(device: torch.device) -> None:
    """warmup_kernels at the model shape must leave nothing to compile for another token count: the capture
    below (5 tokens, never launched before) fails if a kernel compiles inside it."""
    from xrt.kernels.qk_norm_rope import qk_norm_rope_store_kv
    from xrt.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from xrt.kernels.silu_and_mul import silu_and_mul
    from xrt.kernels.warmup import warmup_kernels

    dtype, n, hidden, inter, heads, kv_heads, head_dim, page = torch.bfloat16, 5, 1024, 3072, 16, 8, 128, 16
    warmup_kernels(hidden, inter, heads, kv_heads, head_dim, page, dtype, device)
    gen = torch.Generator().manual_seed(2)

    def fresh() -> dict[str, torch.Tensor]:
        qkv, q_w, k_w, cos_sin, positions = _qk_inputs(gen, dtype, n, heads, kv_heads, head_dim)
        return {
            "x": randn(gen, n, hidden, dtype=dtype), "x2": randn(gen, n, hidden, dtype=dtype),
            "res": randn(gen, n, hidden, dtype=dtype), "w": randn(gen, hidden, dtype=dtype),
            "gu": randn(gen, n, 2 * inter, dtype=dtype), "qkv": qkv, "q_w": q_w, "k_w": k_w, "cos_sin": cos_sin,
            "pos": positions, "cache": randn(gen, 3, 2, page, kv_heads, head_dim, dtype=dtype),
            "slots": random_slots(gen, n, 3, page),
        }

    static = {k: t.to(device) for k, t in fresh().items()}
    s = static
    outs: dict[str, torch.Tensor] = {}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs["norm"] = rms_norm(s["x"], s["w"], EPS)
        fused_add_rms_norm(s["x2"], s["res"], s["w"], EPS)
        qk_norm_rope_store_kv(s["qkv"], s["q_w"], s["k_w"], s["cos_sin"], s["pos"], s["cache"], s["slots"],
                              heads, kv_heads, head_dim, EPS)
        outs["act"] = silu_and_mul(s["gu"])

    for _ in range(2):
        inputs = fresh()
        for k, t in inputs.items():
            static[k].copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        r = inputs
        assert_close(outs["norm"], reference.rms_norm(r["x"], r["w"], EPS), dtype, "graph rms_norm")
        reference.fused_add_rms_norm(r["x2"], r["res"], r["w"], EPS)
        assert_close(static["x2"], r["x2"], dtype, "graph fused_add_rms_norm")
        assert_close(static["res"], r["res"], dtype, "graph fused_add_rms_norm residual")
        reference.qk_norm_rope_store_kv(r["qkv"], r["q_w"], r["k_w"], r["cos_sin"], r["pos"], r["cache"], r["slots"],
                                        heads, kv_heads, head_dim, EPS)
        assert_close(static["qkv"], r["qkv"], dtype, "graph qk_norm_rope_store_kv qkv")
        assert_close(static["cache"], r["cache"], dtype, "graph qk_norm_rope_store_kv cache")
        assert_close(outs["act"], reference.silu_and_mul(r["gu"]), dtype, "graph silu_and_mul")
