"""xrt custom ops on CPU: each against a naive formula, in-place mutation as declared, opcheck,
and the reference paged attention against dense causal attention."""

from __future__ import annotations

import math

import pytest
import torch

import xrt.ops  # noqa: F401  (registers the ops)
from xrt.ops import reference

# The ops as callers reach them: through the dispatcher.
ops = torch.ops.xrt
paged_attention, qk_norm_rope_store_kv, store_kv = ops.paged_attention, ops.qk_norm_rope_store_kv, ops.store_kv
all_gather, all_reduce_ = ops.all_gather, ops.all_reduce_
fused_add_rms_norm = ops.fused_add_rms_norm
qk_norm_rope = ops.qk_norm_rope
rms_norm, silu_and_mul = ops.rms_norm, ops.silu_and_mul


def naive_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return (x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w.double()).to(x.dtype)


def cos_sin_cache(max_pos: int, d: int, base: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, d, 2).double() / d)
    f = torch.arange(max_pos).double()[:, None] * inv[None, :]
    return torch.cat((f.cos(), f.sin()), -1).float()


def naive_rope(x: torch.Tensor, pos: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """Pair element i with i + d/2 and rotate by pos * base^(-2i/d), one element at a time."""
    out = x.clone()
    for i in range(d // 2):
        angle = pos * base ** (-2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        out[..., i] = x[..., i] * c - x[..., i + d // 2] * s
        out[..., i + d // 2] = x[..., i + d // 2] * c + x[..., i] * s
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_formula(dtype: torch.dtype) -> None:
    x, w = torch.randn(7, 48, dtype=dtype) * 3, torch.randn(48, dtype=dtype)
    y = rms_norm(x, w, 1e-6)
    assert y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.float(), naive_rms_norm(x.float(), w.float(), 1e-6), rtol=tol, atol=tol)


def test_fused_add_rms_norm_mutates_both_inputs() -> None:
    x, r, w = torch.randn(5, 32), torch.randn(5, 32), torch.rand(32) + 0.5
    x0, r0 = x.clone(), r.clone()
    assert fused_add_rms_norm(x, r, w, 1e-5) is None
    torch.testing.assert_close(r, x0 + r0)
    torch.testing.assert_close(x, naive_rms_norm(x0 + r0, w, 1e-5), rtol=1e-5, atol=1e-6)


def test_silu_and_mul_matches_formula() -> None:
    x = torch.randn(6, 2 * 24)
    gate, up = x[:, :24], x[:, 24:]
    torch.testing.assert_close(silu_and_mul(x), gate / (1 + torch.exp(-gate)) * up, rtol=1e-5, atol=1e-6)


def test_qk_norm_rope_normalises_and_rotates_q_and_k_only() -> None:
    h, kv, d, t, eps = 4, 2, 16, 5, 1e-6
    qkv = torch.randn(t, (h + 2 * kv) * d)
    qw, kw = torch.rand(d) + 0.5, torch.rand(d) + 0.5
    positions = torch.tensor([0, 3, 7, 1, 30])
    before = qkv.clone()
    assert qk_norm_rope(qkv, qw, kw, cos_sin_cache(64, d), positions, h, kv, d, eps) is None
    q = before[:, : h * d].view(t, h, d)
    k = before[:, h * d : (h + kv) * d].view(t, kv, d)
    for i, p in enumerate(positions.tolist()):
        want_q = naive_rope(naive_rms_norm(q[i], qw, eps), p, d)
        want_k = naive_rope(naive_rms_norm(k[i], kw, eps), p, d)
        torch.testing.assert_close(qkv[i, : h * d].view(h, d), want_q, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(qkv[i, h * d : (h + kv) * d].view(kv, d), want_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(qkv[:, (h + kv) * d :], before[:, (h + kv) * d :], rtol=0, atol=0)


def test_store_kv_writes_slots_and_skips_negative() -> None:
    pages, page, kv, d = 4, 4, 2, 8
    cache = torch.zeros(pages, 2, page, kv, d)
    k, v = torch.randn(3, kv, d), torch.randn(3, kv, d)
    slots = torch.tensor([13, -1, 2])  # page 3 offset 1; skipped; page 0 offset 2
    assert store_kv(k, v, cache, slots) is None
    torch.testing.assert_close(cache[3, 0, 1], k[0])
    torch.testing.assert_close(cache[3, 1, 1], v[0])
    torch.testing.assert_close(cache[0, 0, 2], k[2])
    torch.testing.assert_close(cache[0, 1, 2], v[2])
    written = torch.zeros(pages, page, dtype=torch.bool)
    written[3, 1] = written[0, 2] = True
    assert cache[~written.unsqueeze(1).expand(pages, 2, page)].abs().sum() == 0


def test_qk_norm_rope_store_kv_is_qk_norm_rope_then_store_kv() -> None:
    h, kv, d, t = 4, 2, 8, 5
    qkv = torch.randn(t, (h + 2 * kv) * d)
    qw, kw, cs = torch.rand(d) + 0.5, torch.rand(d) + 0.5, cos_sin_cache(32, d)
    positions, slots = torch.tensor([3, 4, 5, 0, 9]), torch.tensor([6, 7, -1, 0, 17])
    cache = torch.zeros(5, 2, 4, kv, d)
    want_qkv, want_cache = qkv.clone(), cache.clone()
    assert qk_norm_rope_store_kv(qkv, qw, kw, cs, positions, cache, slots, h, kv, d, 1e-6) is None
    qk_norm_rope(want_qkv, qw, kw, cs, positions, h, kv, d, 1e-6)
    k, v = want_qkv[:, h * d :].view(t, 2, kv, d).unbind(1)
    store_kv(k, v, want_cache, slots)
    torch.testing.assert_close(qkv, want_qkv, rtol=0, atol=0)
    torch.testing.assert_close(cache, want_cache, rtol=0, atol=0)
    assert cache[1, 0, 2].abs().sum() > 0 and cache[2:4].abs().sum() == 0  # slot 6 written; pages 2-3 untouched


def test_collectives_are_identity_at_one_rank() -> None:
    """Without a group (TPState.group_name of one rank: "") and over a group of one."""
    x = torch.randn(3, 5)
    x0 = x.clone()
    assert all_reduce_(x, "") is None
    torch.testing.assert_close(x, x0)
    y = all_gather(x, -1, 1, "")
    torch.testing.assert_close(y, x0)
    assert y.data_ptr() != x.data_ptr()


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [n, H, D] are the last n of the sequence whose keys/values are k, v [L, KV, D]."""
    n, h, _ = q.shape
    big_l, kvh, _ = k.shape
    k = k.repeat_interleave(h // kvh, dim=1)
    v = v.repeat_interleave(h // kvh, dim=1)
    out = torch.empty_like(q)
    for i in range(n):
        visible = big_l - n + i + 1
        for head in range(h):
            p = torch.softmax((k[:visible, head] @ q[i, head]) * scale, dim=0)
            out[i, head] = p @ v[:visible, head]
    return out


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_attention_matches_dense_causal(page_size: int) -> None:
    g = torch.Generator().manual_seed(0)
    h, kvh, d, scale = 4, 2, 8, 8**-0.5
    # (prefix already cached, new tokens): ragged, decode-like, page-boundary lengths, prefix only partly paged
    seqs = [(0, 5), (3, 1), (0, 1), (2 * page_size, page_size), (7, 9), (page_size - 1, 2)]
    num_pages = sum(-(-(p + n) // page_size) for p, n in seqs) + 5
    cache = torch.randn(num_pages, 2, page_size, kvh, d, generator=g)
    free = torch.randperm(num_pages, generator=g).tolist()  # non-contiguous, shuffled pages
    qo, kvp, idx, last, qs, wants = [0], [0], [], [], [], []
    for prefix, n in seqs:
        total = prefix + n
        npages = -(-total // page_size)
        pages = [free.pop() for _ in range(npages)]
        idx += pages
        kvp.append(kvp[-1] + npages)
        qo.append(qo[-1] + n)
        last.append(total - (npages - 1) * page_size)
        keys = cache[pages, 0].reshape(-1, kvh, d)[:total]
        vals = cache[pages, 1].reshape(-1, kvh, d)[:total]
        q = torch.randn(n, h, d, generator=g)
        qs.append(q)
        wants.append(dense_causal(q, keys, vals, scale))
    i32 = torch.int32
    out = paged_attention(
        torch.cat(qs), cache, torch.tensor(qo, dtype=i32), torch.tensor(kvp, dtype=i32),
        torch.tensor(idx, dtype=i32), torch.tensor(last, dtype=i32), scale,
    )
    torch.testing.assert_close(out, torch.cat(wants), rtol=1e-5, atol=1e-5)


def test_paged_attention_leaves_empty_sequences_zero() -> None:
    cache = torch.randn(2, 2, 4, 1, 4)
    q = torch.randn(2, 2, 4)
    i32 = torch.int32
    # seq 0: one token over page 1 (3 tokens); seq 1: a padding sequence with no pages
    out = paged_attention(q, cache, torch.tensor([0, 1, 2], dtype=i32), torch.tensor([0, 1, 1], dtype=i32),
                          torch.tensor([1], dtype=i32), torch.tensor([3, 1], dtype=i32), 0.5)
    want = dense_causal(q[:1], cache[1, 0, :3], cache[1, 1, :3], 0.5)
    torch.testing.assert_close(out[:1], want, rtol=1e-5, atol=1e-5)
    assert out[1].abs().sum() == 0


def opcheck_cases() -> list[tuple[object, tuple]]:
    h, kv, d, t = 2, 1, 8, 3
    i32 = torch.int32
    return [
        (torch.ops.xrt.rms_norm.default, (torch.randn(3, 8), torch.rand(8), 1e-6)),
        (torch.ops.xrt.rms_norm.default, (torch.randn(3, 8), torch.rand(8), 1e-6, True)),
        (torch.ops.xrt.linear.default, (torch.randn(3, 8), torch.randn(5, 8))),
        (torch.ops.xrt.linear.default, (torch.randn(3, 8), torch.randn(5, 8), False)),
        (torch.ops.xrt.fused_add_rms_norm.default, (torch.randn(3, 8), torch.randn(3, 8), torch.rand(8), 1e-6)),
        (torch.ops.xrt.silu_and_mul.default, (torch.randn(3, 8),)),
        (torch.ops.xrt.silu_and_mul.default, (torch.randn(3, 8), True)),
        (
            torch.ops.xrt.qk_norm_rope.default,
            (torch.randn(t, (h + 2 * kv) * d), torch.rand(d), torch.rand(d), cos_sin_cache(16, d),
             torch.tensor([0, 5, 2]), h, kv, d, 1e-6),
        ),
        (
            torch.ops.xrt.qk_norm_rope_store_kv.default,
            (torch.randn(t, (h + 2 * kv) * d), torch.rand(d), torch.rand(d), cos_sin_cache(16, d),
             torch.tensor([0, 5, 2]), torch.zeros(2, 2, 4, kv, d), torch.tensor([0, -1, 5]), h, kv, d, 1e-6),
        ),
        (
            torch.ops.xrt.store_kv.default,
            (torch.randn(t, kv, d), torch.randn(t, kv, d), torch.zeros(2, 2, 4, kv, d), torch.tensor([0, -1, 5])),
        ),
        (
            torch.ops.xrt.paged_attention.default,
            (torch.randn(t, h, d), torch.randn(2, 2, 4, kv, d), torch.tensor([0, 2, 3], dtype=i32),
             torch.tensor([0, 1, 2], dtype=i32), torch.tensor([1, 0], dtype=i32), torch.tensor([3, 2], dtype=i32),
             0.3),
        ),
        (torch.ops.xrt.all_reduce_.default, (torch.randn(3, 4), "")),
        (torch.ops.xrt.all_gather.default, (torch.randn(3, 4), 1, 1, "")),
    ]


@pytest.mark.parametrize("op,args", opcheck_cases(), ids=lambda v: getattr(v, "__name__", ""))
def test_opcheck(op: object, args: tuple) -> None:
    torch.library.opcheck(op, args)


def test_reference_functions_are_the_op_impls() -> None:
    x, w = torch.randn(4, 16), torch.rand(16)
    torch.testing.assert_close(reference.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6), rtol=0, atol=0)
    torch.testing.assert_close(reference.silu_and_mul(x), silu_and_mul(x), rtol=0, atol=0)


SCHEMAS = {
    "rms_norm": "xrt::rms_norm(Tensor x, Tensor weight, float eps, bool? pdl=None) -> Tensor",
    "fused_add_rms_norm": (
        "xrt::fused_add_rms_norm(Tensor(a0!) x, Tensor(a1!) residual, Tensor weight, float eps, bool? pdl=None) -> ()"
    ),
    "silu_and_mul": "xrt::silu_and_mul(Tensor x, bool? pdl=None) -> Tensor",
    "linear": "xrt::linear(Tensor x, Tensor weight, bool? pdl=None) -> Tensor",
    "store_kv": (
        "xrt::store_kv(Tensor k, Tensor v, Tensor(a2!) kv_cache, Tensor slot_mapping, bool? pdl=None) -> ()"
    ),
    "all_reduce_": "xrt::all_reduce_(Tensor(a0!) x, str group_name) -> ()",
    "all_gather": "xrt::all_gather(Tensor x, SymInt dim, SymInt group_size, str group_name) -> Tensor",
}


def test_op_schemas_are_the_contract() -> None:
    for name, schema in SCHEMAS.items():
        assert str(getattr(torch.ops.xrt, name).default._schema) == schema


def test_a_device_kernel_registered_later_overrides_the_reference() -> None:
    """What xrt.ops.cuda_impls does for CUDA, done for CPU in a scoped library: the op, called through
    its Python entry point, runs the registered kernel; the reference is back once the library is gone."""
    from xrt.ops.registry import implementation

    calls: list[int] = []

    def kernel(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return reference.silu_and_mul(x) + 1

    x = torch.randn(3, 8)
    with torch.library._scoped_library("xrt", "FRAGMENT") as lib:
        torch.library.register_kernel("xrt::silu_and_mul", "cpu", kernel, lib=lib)
        torch.testing.assert_close(silu_and_mul(x), reference.silu_and_mul(x) + 1)
    assert calls == [3]
    torch.testing.assert_close(silu_and_mul(x), reference.silu_and_mul(x), rtol=0, atol=0)
    assert implementation("silu_and_mul", "cpu") is reference.silu_and_mul
