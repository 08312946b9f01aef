"""The split-KV decode attention kernel (xrt.kernels.decode_attention) against the reference paged attention
(xrt.ops.reference.paged_attention, fp32, one query per sequence): shuffled page ids, lengths of one token and
on page boundaries, empty (padding) sequences, GQA groups, page and head sizes, one chunk and many, reuse of
one object with new metadata, the Qwen3-0.6B shape, and replay inside a CUDA graph with new metadata.

The check_* functions are device-agnostic so test_decode_attention_interpret.py runs them on CPU under
TRITON_INTERPRET=1; the kernel module is imported inside them, so collecting this file never imports triton."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import torch

from xrt.config import ExecutorArgs
from xrt.executor.buckets import Buckets
from xrt.ops import reference

# Max |out - ref| / max |ref| against the fp32 reference: 16-bit outputs are rounded once and the
# probabilities are rounded to the KV dtype before the P @ V product.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}
# Qwen3-0.6B attention: q heads, KV heads, head_dim.
QWEN3_06B = (16, 8, 128)


def module() -> ModuleType:
    return importlib.import_module("xrt.kernels.decode_attention")


@dataclass
class Case:
    q: torch.Tensor  # [B, H, D]
    kv_cache: torch.Tensor  # [P, 2, page, KV, D]
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    lens: list[int]

    def to(self, device: torch.device) -> Case:
        return Case(self.q.to(device), self.kv_cache.to(device), self.kv_indptr.to(device),
                    self.kv_indices.to(device), self.kv_last_page_len.to(device), self.lens)


def make_case(lens: list[int], heads: int, kv_heads: int, head_dim: int, page_size: int, dtype: torch.dtype,
              seed: int = 0, spare_pages: int = 5) -> Case:
    """Random q and cache; each sequence's pages are distinct random ids from a shuffled pool larger than needed,
    so neither contiguity nor the page order can be relied on. Length 0 is a padding row (no pages, last 1)."""
    gen = torch.Generator().manual_seed(seed)
    npages = [-(-n // page_size) for n in lens]
    total = sum(npages)
    num_pages = total + spare_pages
    kv_cache = torch.randn(num_pages, 2, page_size, kv_heads, head_dim, generator=gen).to(dtype)
    indices = torch.randperm(num_pages, generator=gen)[:total].to(torch.int32)
    indptr = torch.tensor([0, *torch.tensor(npages, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size if p else 1 for n, p in zip(lens, npages, strict=True)],
                        dtype=torch.int32)
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    return Case(q, kv_cache, indptr, indices, last, list(lens))


def expected(case: Case, scale: float) -> torch.Tensor:
    c = case.to(torch.device("cpu"))
    qo_indptr = torch.arange(len(c.lens) + 1, dtype=torch.int32)
    return reference.paged_attention(c.q.float(), c.kv_cache.float(), qo_indptr, c.kv_indptr, c.kv_indices,
                                     c.kv_last_page_len, scale)


def assert_matches(out: torch.Tensor, case: Case, what: str) -> None:
    dtype = case.q.dtype
    scale = case.q.shape[-1] ** -0.5
    ref = expected(case, scale)
    out = out.detach().cpu().float()
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    for i, n in enumerate(case.lens):
        if n == 0:
            assert torch.all(out[i] == 0), f"{what}: padding row {i} is not zero"
    err = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    assert err < TOLERANCE[dtype], f"{what} {dtype} lens={case.lens}: relative error {err:.3e}"


def build(device: torch.device, heads: int, kv_heads: int, head_dim: int, page_size: int, max_batch: int,
          max_len: int, **kwargs: Any) -> Any:
    max_pages = max(1, -(-max_len // page_size))
    return module().DecodeAttention(max_batch, heads, kv_heads, head_dim, page_size, max_pages, device, **kwargs)


def check_decode(device: torch.device, dtype: torch.dtype, lens: list[int], heads: int, kv_heads: int,
                 head_dim: int, page_size: int, seed: int = 0, **kwargs: Any) -> None:
    """One run on a fresh object (kwargs: split_tokens, max_splits, block_n, ...) against the reference;
    the arrival counters are back at zero afterwards."""
    case = make_case(lens, heads, kv_heads, head_dim, page_size, dtype, seed).to(device)
    attn = build(device, heads, kv_heads, head_dim, page_size, len(lens), max(lens), **kwargs)
    # NaN-filled: every row, padding included, must be written.
    out = torch.full_like(case.q, float("nan"))
    attn.run(case.q, case.kv_cache, case.kv_indptr, case.kv_indices, case.kv_last_page_len, head_dim ** -0.5,
             out=out)
    assert_matches(out, case, f"heads {heads}/{kv_heads} d{head_dim} page {page_size} {kwargs}")
    assert int(attn.counters.abs().sum()) == 0, "arrival counters were not reset"


def check_reuse(device: torch.device, dtype: torch.dtype) -> None:
    """One object, successive runs with new metadata and batch sizes: long sequences cut into many chunks,
    then shorter ones into fewer (stale partials past a sequence's chunk count must not be merged), padding rows
    appearing and disappearing, into a given `out` (returned, no new tensor). Equal inputs give bit-equal
    outputs."""
    heads, kv_heads, head_dim, page_size = 4, 2, 32, 8
    attn = build(device, heads, kv_heads, head_dim, page_size, max_batch=4, max_len=96, split_tokens=16,
                 block_n=16)
    rounds = [[96, 90, 57, 80], [20, 0, 33], [0, 0, 1, 64], [40]]
    for seed, lens in enumerate(rounds):
        case = make_case(lens, heads, kv_heads, head_dim, page_size, dtype, seed=seed + 10).to(device)
        out = torch.full_like(case.q, float("nan"))
        args = (case.q, case.kv_cache, case.kv_indptr, case.kv_indices, case.kv_last_page_len, head_dim ** -0.5)
        ret = attn.run(*args, out=out)
        assert ret is out
        assert_matches(out, case, f"reuse round {seed}")
        assert int(attn.counters.abs().sum()) == 0, f"round {seed}: arrival counters were not reset"
        if seed == 0:
            again = attn.run(*args)
            assert torch.equal(again, out), "a second run of the same inputs differs"


def check_split_policy() -> None:
    """The default split counts fill an H200 at small batches, never grow with the batch, stay under the
    context's chunk count, and size the workspace; a fixed max_splits applies to every batch, or up to
    fixed_max_batch and caps the counts above it."""
    m = module()
    heads, kv_heads, head_dim = QWEN3_06B
    attn = m.DecodeAttention(32, heads, kv_heads, head_dim, 16, 256, torch.device("cpu"))
    splits = [attn.splits_for(b) for b in range(1, 33)]
    assert splits == sorted(splits, reverse=True)
    assert splits[0] >= 16 and splits[0] * kv_heads >= 132, splits[0]
    for b, s in enumerate(splits, start=1):
        assert s <= -(-4096 // attn.split_tokens)
        assert b * kv_heads * s <= 2 * m.TARGET_PROGRAMS or s == 1, (b, s)
    assert attn.partial_out.shape == (32, heads, splits[0], head_dim)
    assert attn.partial_lse.shape == (32, heads, splits[0])
    assert attn.counters.shape == (32 * kv_heads,) and attn.counters.dtype == torch.int32
    # A short max context caps the split count: 128 tokens are at most 2 chunks of 64.
    short = m.DecodeAttention(4, heads, kv_heads, head_dim, 16, 8, torch.device("cpu"), split_tokens=64)
    assert short.splits_for(1) == 2
    fixed = m.DecodeAttention(16, heads, kv_heads, head_dim, 16, 64, torch.device("cpu"), max_splits=6)
    assert {fixed.splits_for(b) for b in (1, 3, 16)} == {6}
    # The backend's (xrt.attention.flashinfer): fixed up to 2 rows, fewer chunks for more rows, and the same
    # count for a batch and the default CUDA-graph bucket it pads to.
    small = m.DecodeAttention(8, heads, kv_heads, head_dim, 16, 129, torch.device("cpu"), split_tokens=64,
                              max_splits=33, fixed_max_batch=2)
    counts = [small.splits_for(b) for b in range(1, 9)]
    assert counts[:2] == [33, 33] and counts == sorted(counts, reverse=True) and counts[-1] < counts[2] < 33, counts
    assert small.ws_splits == 33 and small.partial_lse.shape == (8, heads, 33)
    buckets = Buckets.from_args(ExecutorArgs())
    for b in range(1, 9):
        assert small.splits_for(b) == small.splits_for(buckets.bucket_for(b)), b


def check_padded_to_bucket(device: torch.device, dtype: torch.dtype) -> None:
    """A batch of 3 above fixed_max_batch, run as it is (eager) and padded with an empty row to its default
    CUDA-graph bucket, gives bit-equal rows: both cut each sequence into the same chunks. Sized so that the split
    count aimed at 3 rows themselves would differ from the bucket's."""
    heads, kv_heads, head_dim, page_size = 8, 8, 32, 8
    lens = [300, 477, 512]
    padded_to = Buckets.from_args(ExecutorArgs()).bucket_for(len(lens))
    attn = build(device, heads, kv_heads, head_dim, page_size, max_batch=padded_to, max_len=512, split_tokens=16,
                 block_n=16, max_splits=32, fixed_max_batch=2)
    m = module()
    assert -(-m.TARGET_PROGRAMS // (len(lens) * kv_heads)) != attn.splits_for(padded_to) < 32
    case = make_case(lens, heads, kv_heads, head_dim, page_size, dtype, seed=3).to(device)
    scale = head_dim ** -0.5
    eager = attn.run(case.q, case.kv_cache, case.kv_indptr, case.kv_indices, case.kv_last_page_len, scale).clone()
    pad = padded_to - len(lens)
    q = torch.cat([case.q, torch.zeros(pad, heads, head_dim, dtype=dtype, device=device)])
    indptr = torch.cat([case.kv_indptr, case.kv_indptr[-1:].repeat(pad)])
    last = torch.cat([case.kv_last_page_len, torch.ones(pad, dtype=torch.int32, device=device)])
    graph = attn.run(q, case.kv_cache, indptr, case.kv_indices, last, scale)
    assert_matches(eager, case, "eager batch 3")
    assert torch.equal(graph[:len(lens)], eager), "a batch padded to its bucket differs from the batch run as it is"
    assert torch.all(graph[len(lens):] == 0)


def newest_slots(case: Case, page_size: int) -> torch.Tensor:
    """Each sequence's last token's cache slot (its last page, last offset); -1 for a padding row."""
    c = case.to(torch.device("cpu"))
    return torch.tensor([int(c.kv_indices[int(c.kv_indptr[i + 1]) - 1]) * page_size + int(c.kv_last_page_len[i]) - 1
                         if n else -1 for i, n in enumerate(c.lens)], dtype=torch.int64)


def check_rope(device: torch.device, dtype: torch.dtype, lens: list[int], heads: int, kv_heads: int, head_dim: int,
               page_size: int, seed: int = 0, **kwargs: Any) -> None:
    """The fused variant (run(..., rope=)) from a raw qkv against the two ops it replaces, in the reference:
    xrt::qk_norm_rope_store_kv (q and k normalised and rotated, the newest k and v written to the cache), then
    paged attention over the cache. The output within the dtype's tolerance, the cache equal to the reference's
    at the written slots within one rounding and bit for bit everywhere else, qkv untouched."""
    from xrt.layers.rotary import build_cos_sin_cache

    m = module()
    case = make_case(lens, heads, kv_heads, head_dim, page_size, dtype, seed)
    batch, width, eps = len(lens), (heads + 2 * kv_heads) * head_dim, 1e-6
    gen = torch.Generator().manual_seed(seed + 1)
    qkv = (3 * torch.randn(batch, width, generator=gen)).to(dtype)
    q_w = (1 + 0.2 * torch.randn(head_dim, generator=gen)).to(dtype)
    k_w = (1 + 0.2 * torch.randn(head_dim, generator=gen)).to(dtype)
    cos_sin = build_cos_sin_cache(head_dim, max(lens) + 1, 10000.0, "cpu")
    positions = torch.tensor([max(n - 1, 0) for n in lens], dtype=torch.int64)
    slots = newest_slots(case, page_size)
    ref_qkv, ref_cache = qkv.clone(), case.kv_cache.clone()
    reference.qk_norm_rope_store_kv(ref_qkv, q_w, k_w, cos_sin, positions, ref_cache, slots, heads, kv_heads,
                                    head_dim, eps)
    ref = Case(ref_qkv[:, : heads * head_dim].reshape(batch, heads, head_dim), ref_cache, case.kv_indptr,
               case.kv_indices, case.kv_last_page_len, case.lens)

    dev = case.to(device)
    attn = build(device, heads, kv_heads, head_dim, page_size, batch, max(lens), **kwargs)
    qkv_dev = qkv.to(device)
    rope = m.QKNormRope(q_w.to(device), k_w.to(device), cos_sin.to(device), positions.to(device), slots.to(device), eps)
    out = torch.full((batch, heads, head_dim), float("nan"), dtype=dtype, device=device)
    attn.run(qkv_dev.view(batch, heads + 2 * kv_heads, head_dim), dev.kv_cache, dev.kv_indptr, dev.kv_indices,
             dev.kv_last_page_len, head_dim ** -0.5, out=out, rope=rope)
    assert_matches(out, ref, f"rope heads {heads}/{kv_heads} d{head_dim} page {page_size} {kwargs}")
    assert torch.equal(qkv_dev.cpu(), qkv), "the fused kernel wrote qkv"
    cache = dev.kv_cache.cpu()
    written = torch.zeros(cache.shape[0] * page_size, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    written = written.view(cache.shape[0], page_size)
    assert torch.equal(cache.transpose(1, 2)[~written], case.kv_cache.transpose(1, 2)[~written]), \
        "the fused kernel wrote a slot other than the newest tokens'"
    got, want = cache.transpose(1, 2)[written].float(), ref_cache.transpose(1, 2)[written].float()
    ulp = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]
    torch.testing.assert_close(got, want, rtol=ulp, atol=ulp, msg=lambda msg: f"newest k/v in the cache: {msg}")
    assert int(attn.counters.abs().sum()) == 0, "arrival counters were not reset"


def check_errors(device: torch.device) -> None:
    m = module()
    with pytest.raises(ValueError, match="num_heads: expected a positive multiple of num_kv_heads"):
        m.DecodeAttention(2, 6, 4, 32, 16, 4, device)
    with pytest.raises(ValueError, match="head_dim: expected a power of two"):
        m.DecodeAttention(2, 4, 2, 48, 16, 4, device)
    with pytest.raises(ValueError, match="split_tokens: expected a power of two >= 16"):
        m.DecodeAttention(2, 4, 2, 32, 16, 4, device, split_tokens=24)
    with pytest.raises(ValueError, match="max_splits: expected >= 1"):
        m.DecodeAttention(2, 4, 2, 32, 16, 4, device, max_splits=0)
    attn = m.DecodeAttention(2, 4, 2, 32, 16, 4, device)
    case = make_case([5, 9], 4, 2, 32, 16, torch.float32).to(device)
    args = [case.q, case.kv_cache, case.kv_indptr, case.kv_indices, case.kv_last_page_len, 0.1]
    with pytest.raises(ValueError, match="batch 3 exceeds max_batch 2"):
        attn.run(torch.cat([case.q, case.q[:1]]), *args[1:])
    with pytest.raises(ValueError, match=r"q: expected \[B, 4, 32\]"):
        attn.run(case.q[:, :2], *args[1:])
    with pytest.raises(ValueError, match=r"kv_cache: expected \[pages, 2, 16, 2, 32\]"):
        attn.run(case.q, case.kv_cache[:, :, :8], *args[2:])
    with pytest.raises(ValueError, match="kv_indptr: expected a contiguous int32 vector of at least 3"):
        attn.run(case.q, case.kv_cache, case.kv_indptr.long(), *args[3:])
    with pytest.raises(ValueError, match="kv_last_page_len: expected a contiguous int32 vector of at least 2"):
        attn.run(*args[:4], case.kv_last_page_len[:1], 0.1)
    with pytest.raises(ValueError, match="out: expected shape"):
        attn.run(*args, out=case.q[:1].clone())
    empty = attn.run(case.q[:0], *args[1:])
    assert empty.shape == (0, 4, 32)
    qkv = torch.zeros(2, 8, 32, device=device)
    w, positions = torch.ones(32, device=device), torch.zeros(2, dtype=torch.int64, device=device)
    rope = m.QKNormRope(w, w, torch.zeros(4, 32, device=device), positions, positions, 1e-6)
    with pytest.raises(ValueError, match=r"q: expected the packed qkv \[B, 8, 32\]"):
        attn.run(case.q, *args[1:], rope=rope)
    with pytest.raises(ValueError, match=r"rope.k_weight: expected a contiguous \[32\]"):
        attn.run(qkv, *args[1:], rope=m.QKNormRope(w, w[:16], rope.cos_sin_cache, positions, positions, 1e-6))
    with pytest.raises(ValueError, match=r"rope.cos_sin_cache: expected \[max_pos, 32\]"):
        attn.run(qkv, *args[1:], rope=m.QKNormRope(w, w, w, positions, positions, 1e-6))
    with pytest.raises(ValueError, match="rope.slot_mapping: expected a contiguous vector of at least 2"):
        attn.run(qkv, *args[1:], rope=m.QKNormRope(w, w, rope.cos_sin_cache, positions, positions[:1], 1e-6))


# ---------------------------------------------------------------- GPU tests (tests/conftest.py: `device`)

# (lens, heads, kv heads, head_dim, page size, kernel kwargs): one chunk, many chunks, page boundaries, a
# one-token sequence, padding rows, GQA 1/2/4/8, page sizes 1..64, head_dim 64/128.
CASES = [
    ([1], 16, 8, 128, 16, {}),
    ([1024], 16, 8, 128, 16, {}),
    ([1, 16, 32, 100, 0, 513, 0], 16, 8, 128, 16, {}),
    ([77, 0, 300, 1, 64], 8, 8, 64, 16, {"split_tokens": 16, "block_n": 16}),
    ([200, 33, 0], 16, 4, 128, 1, {"split_tokens": 32}),
    ([129, 8, 64, 1], 32, 4, 64, 8, {"max_splits": 3}),
    ([1000, 65, 0], 16, 8, 128, 32, {"split_tokens": 128}),
    ([640, 3], 8, 1, 128, 64, {"split_tokens": 16, "max_splits": 40}),
    ([4096, 1, 2048], 16, 8, 128, 16, {}),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(("lens", "heads", "kv_heads", "head_dim", "page_size", "kwargs"), CASES,
                         ids=[f"{c[0][:3]}-h{c[1]}/{c[2]}-d{c[3]}-p{c[4]}" for c in CASES])
def test_decode_matches_reference(device: torch.device, dtype: torch.dtype, lens: list[int], heads: int,
                                  kv_heads: int, head_dim: int, page_size: int, kwargs: dict) -> None:
    check_decode(device, dtype, lens, heads, kv_heads, head_dim, page_size, **kwargs)


@pytest.mark.parametrize("batch", [1, 8, 16])
@pytest.mark.parametrize("split_tokens", [None, 32, 128])
def test_qwen3_06b_shape(device: torch.device, batch: int, split_tokens: int | None) -> None:
    gen = torch.Generator().manual_seed(batch)
    lens = [1024] + torch.randint(900, 1300, (batch - 1,), generator=gen).tolist()
    check_decode(device, torch.bfloat16, lens, *QWEN3_06B, 16, seed=batch, split_tokens=split_tokens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("lens", "heads", "kv_heads", "head_dim", "page_size", "kwargs"), CASES,
                         ids=[f"{c[0][:3]}-h{c[1]}/{c[2]}-d{c[3]}-p{c[4]}" for c in CASES])
def test_rope_variant_matches_the_ops_it_replaces(device: torch.device, dtype: torch.dtype, lens: list[int],
                                                  heads: int, kv_heads: int, head_dim: int, page_size: int,
                                                  kwargs: dict) -> None:
    check_rope(device, dtype, lens, heads, kv_heads, head_dim, page_size, **kwargs)


@pytest.mark.parametrize("shape", [QWEN3_06B, (32, 8, 128)], ids=["0.6b", "8b"])
@pytest.mark.parametrize("lens", [[1], [1024], [1100, 37], [64, 4096]], ids=str)
def test_rope_variant_as_the_backend_builds_it(device: torch.device, shape: tuple[int, int, int],
                                               lens: list[int]) -> None:
    """The Qwen3 shapes with FlashInfer backend's small-decode settings (64-token chunks, splits fixed for a
    4096-token context): the newest token in the last of many chunks, or alone in the first."""
    check_rope(device, torch.bfloat16, lens, *shape, 16, seed=len(lens), split_tokens=64, max_splits=64)


def test_reuse_with_new_metadata(device: torch.device) -> None:
    check_reuse(device, torch.bfloat16)


def test_errors(device: torch.device) -> None:
    check_errors(device)


def test_replays_in_a_cuda_graph_with_new_metadata(device: torch.device) -> None:
    """Two buckets (1 and 8 sequences) captured in one graph on one object (shared workspace and counters),
    replayed after the metadata tensors' contents change: page tables, lengths, padding rows and q."""
    heads, kv_heads, head_dim = QWEN3_06B
    page_size, max_len, dtype = 16, 2048, torch.bfloat16
    max_pages = max_len // page_size
    attn = build(device, heads, kv_heads, head_dim, page_size, max_batch=8, max_len=max_len)
    num_pages = 8 * max_pages + 16
    kv_cache = torch.randn(num_pages, 2, page_size, kv_heads, head_dim, device=device).to(dtype)
    buckets = []
    for batch in (1, 8):
        static = {"q": torch.zeros(batch, heads, head_dim, dtype=dtype, device=device),
                  "kv_indptr": torch.zeros(batch + 1, dtype=torch.int32, device=device),
                  "kv_indices": torch.zeros(batch * max_pages, dtype=torch.int32, device=device),
                  "kv_last_page_len": torch.ones(batch, dtype=torch.int32, device=device),
                  "out": torch.zeros(batch, heads, head_dim, dtype=dtype, device=device)}
        buckets.append(static)

    def launch(s: dict[str, torch.Tensor]) -> None:
        attn.run(s["q"], kv_cache, s["kv_indptr"], s["kv_indices"], s["kv_last_page_len"], head_dim ** -0.5,
                 out=s["out"])

    def fill(s: dict[str, torch.Tensor], lens: list[int], seed: int) -> Case:
        case = make_case(lens, heads, kv_heads, head_dim, page_size, dtype, seed=seed,
                         spare_pages=num_pages - sum(-(-n // page_size) for n in lens))
        s["q"].copy_(case.q)
        s["kv_indptr"].copy_(case.kv_indptr)
        s["kv_indices"][: case.kv_indices.numel()].copy_(case.kv_indices)
        s["kv_last_page_len"].copy_(case.kv_last_page_len)
        kv_cache.copy_(case.kv_cache)
        return Case(s["q"], kv_cache, s["kv_indptr"], s["kv_indices"], s["kv_last_page_len"], lens)

    fill(buckets[0], [100], 0)
    fill(buckets[1], [100] * 8, 0)
    for s in buckets:  # compiles outside the capture
        launch(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s in buckets:
            launch(s)
    rounds = [([1024], [1024, 1, 16, 0, 1100, 2048, 0, 0]),
              ([17], [5, 600, 2047, 33, 32, 0, 1, 999]),
              ([0], [1280] * 6 + [0, 0])]
    for seed, (lens1, lens8) in enumerate(rounds):
        # Both buckets read the one cache: fill the second bucket's case into it, and give the first its pages.
        case8 = fill(buckets[1], lens8, seed=100 + seed)
        gen = torch.Generator().manual_seed(seed)
        n1 = -(-lens1[0] // page_size)
        buckets[0]["q"].copy_(torch.randn(1, heads, head_dim, generator=gen).to(dtype))
        buckets[0]["kv_indptr"].copy_(torch.tensor([0, n1], dtype=torch.int32))
        buckets[0]["kv_indices"][:n1].copy_(torch.randperm(num_pages, generator=gen)[:n1].to(torch.int32))
        buckets[0]["kv_last_page_len"].fill_(lens1[0] - (n1 - 1) * page_size if n1 else 1)
        case1 = Case(buckets[0]["q"], kv_cache, buckets[0]["kv_indptr"], buckets[0]["kv_indices"],
                     buckets[0]["kv_last_page_len"], lens1)
        for s in buckets:
            s["out"].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(buckets[0]["out"], case1, f"graph replay {seed}, bucket 1")
        assert_matches(buckets[1]["out"], case8, f"graph replay {seed}, bucket 8")
        assert int(attn.counters.abs().sum()) == 0, f"replay {seed}: arrival counters were not reset"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_matches_flashinfer_decode() -> None:
    """Against FlashInfer's decode wrapper, what the kernel replaces, at the 0.6B shape."""
    flashinfer = pytest.importorskip("flashinfer")
    pytest.importorskip("triton")
    heads, kv_heads, head_dim = QWEN3_06B
    lens = [1024, 1, 700, 0, 1279]
    case = make_case(lens, heads, kv_heads, head_dim, 16, torch.bfloat16, seed=7).to(torch.device("cuda"))
    attn = build(torch.device("cuda"), heads, kv_heads, head_dim, 16, len(lens), max(lens))
    out = attn.run(case.q, case.kv_cache, case.kv_indptr, case.kv_indices, case.kv_last_page_len,
                   head_dim ** -0.5)
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(case.kv_indptr.cpu(), case.kv_indices, case.kv_last_page_len.cpu(), heads, kv_heads, head_dim,
                 16, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=head_dim ** -0.5)
    ref = wrapper.run(case.q, case.kv_cache).float()
    live = [i for i, n in enumerate(lens) if n]
    err = ((out.float()[live] - ref[live]).abs().max() / ref[live].abs().max()).item()
    assert err < 2e-2, f"relative difference to FlashInfer {err:.3e}"


@pytest.mark.parametrize("lens", [[1100, 37], [64, 1, 65], [4096]], ids=str)
def test_reads_the_token_the_kernel_before_writes_after_it(device: torch.device, lens: list[int]) -> None:
    """A decode step's order with PDL: qk_norm_rope_store_kv writes each sequence's last token (over NaN here),
    the attention kernel launched right after it (PDL, no synchronization between) must read it only once that
    kernel has finished; reading it early gives NaN or the wrong attention. (The kernel reads only the metadata
    before the wait; reading older K/V there too was tried and measured slower: bench/NOTES.md.)"""
    from xrt.kernels.qk_norm_rope import qk_norm_rope_store_kv

    heads, kv_heads, head_dim = QWEN3_06B
    page_size, dtype, batch = 16, torch.bfloat16, len(lens)
    case = make_case(lens, heads, kv_heads, head_dim, page_size, dtype, seed=len(lens)).to(device)
    slots = torch.tensor([int(case.kv_indices[int(case.kv_indptr[i + 1]) - 1]) * page_size
                          + int(case.kv_last_page_len[i]) - 1 for i in range(batch)], device=device)
    attn = build(device, heads, kv_heads, head_dim, page_size, batch, max(lens))
    gen = torch.Generator().manual_seed(7)
    qkv0 = torch.randn(batch, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype).to(device)
    cos_sin = torch.randn(max(lens), head_dim, generator=gen).to(device)
    positions = torch.tensor([n - 1 for n in lens], device=device)
    norm_w = torch.ones(head_dim, dtype=dtype, device=device)
    for round_ in range(3):
        cache = case.kv_cache.clone()
        pages, offsets = slots // page_size, slots % page_size
        cache[pages, :, offsets] = float("nan")
        qkv = qkv0 + round_
        attn.run(qkv[:, : heads * head_dim].view(batch, heads, head_dim), cache, case.kv_indptr,
                 case.kv_indices, case.kv_last_page_len, head_dim ** -0.5, pdl=True)  # compiled, in flight
        qk_norm_rope_store_kv(qkv, norm_w, norm_w, cos_sin, positions, cache, slots, heads, kv_heads, head_dim,
                              1e-6, pdl=True)
        q = qkv[:, : heads * head_dim].view(batch, heads, head_dim)
        out = attn.run(q, cache, case.kv_indptr, case.kv_indices, case.kv_last_page_len, head_dim ** -0.5,
                       pdl=True)
        torch.cuda.synchronize()
        assert_matches(out, Case(q, cache, case.kv_indptr, case.kv_indices, case.kv_last_page_len, lens),
                       f"round {round_}")
