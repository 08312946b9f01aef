"""FlashInfer attention backend against the torch reference (`xrt.ops.reference.paged_attention`):
ragged prefill with and without cached prefixes, decode, page boundaries, bf16 and fp16 KV, padded
decode buckets and a captured CUDA-graph decode re-planned with new lengths.

Every case uses head_dim 128 so the whole file (and the executor tests) share a few JIT modules. FlashInfer
0.6.14 JIT-compiles one module per (dtype, wrapper kind) on first use: bf16 decode (~11 s cold) and bf16
prefill (paged and ragged share it, ~75 s cold) are what the models here use; the fp16 pair and the
tensor-core (GQA group >= 4) decode are three more, so their tests are `slow` (full run only)."""

from __future__ import annotations

import math

import pytest
import torch

from xrt.attention.backend import AttentionShape
from xrt.attention.metadata import AttentionMetadata, HostCSR
from xrt.ops import reference

pytest.importorskip("flashinfer")

HEAD_DIM = 128
PAGE_SIZE = 16
NUM_PAGES = 160
TOLERANCE = 1e-2  # max |out - ref| / max |ref| for bf16/fp16 outputs


def build_meta(
    seqs: list[tuple[int, int]], page_size: int, num_pages: int, device: torch.device, gen: torch.Generator,
    is_prefill: bool,
) -> AttentionMetadata:
    """seqs: (prefix_len, new_len) per sequence; pages are drawn at random without reuse."""
    perm = torch.randperm(num_pages, generator=gen).tolist()
    qo, kvp, indices, last, seq_lens, positions, slots = [0], [0], [], [], [], [], []
    for prefix, new in seqs:
        kv_len = prefix + new
        n_pages = math.ceil(kv_len / page_size)
        pages, perm = perm[:n_pages], perm[n_pages:]
        qo.append(qo[-1] + new)
        kvp.append(kvp[-1] + n_pages)
        indices += pages
        last.append(kv_len - (n_pages - 1) * page_size)
        seq_lens.append(kv_len)
        for p in range(prefix, kv_len):
            positions.append(p)
            slots.append(pages[p // page_size] * page_size + p % page_size)

    def i32(x: list[int]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32)

    host = {"qo": i32(qo), "kvp": i32(kvp), "idx": i32(indices), "last": i32(last), "lens": i32(seq_lens)}
    return AttentionMetadata(
        is_prefill=is_prefill,
        num_seqs=len(seqs),
        num_tokens=qo[-1],
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        qo_indptr=host["qo"].to(device),
        kv_indptr=host["kvp"].to(device),
        kv_indices=host["idx"].to(device),
        kv_last_page_len=host["last"].to(device),
        seq_lens=host["lens"].to(device),
        logits_indices=(torch.tensor(qo[1:], dtype=torch.int64) - 1).to(device),
        has_prefix=any(prefix > 0 for prefix, _ in seqs),
        page_size=page_size,
        host=HostCSR(host["qo"], host["kvp"], host["idx"], host["last"], host["lens"]),
    )


def make_backend(heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device, **kw: object) -> object:
    from xrt.attention.flashinfer import FlashInferBackend

    shape = AttentionShape(heads, kv_heads, HEAD_DIM, PAGE_SIZE, dtype, device)
    return FlashInferBackend(shape, workspace_mb=64, **kw)


def random_inputs(
    meta: AttentionMetadata, heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    # q as a strided view of a packed qkv row, exactly as the attention layer hands it over.
    qkv = torch.randn(meta.num_tokens, (heads + 2 * kv_heads) * HEAD_DIM, generator=gen, device=device, dtype=dtype)
    q = qkv[:, : heads * HEAD_DIM].view(meta.num_tokens, heads, HEAD_DIM)
    kv_cache = torch.randn(NUM_PAGES, 2, PAGE_SIZE, kv_heads, HEAD_DIM, generator=gen, device=device, dtype=dtype)
    return q, kv_cache


def ref_attention(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    return reference.paged_attention(
        q, kv_cache, meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len, HEAD_DIM**-0.5
    )


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all()
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


PREFILL_NO_PREFIX = [(0, 1), (0, 7), (0, 16), (0, 17), (0, 33), (0, 100)]
PREFILL_WITH_PREFIX = [(16, 1), (5, 12), (0, 20), (31, 33), (64, 64), (15, 2)]
DECODE = [(0, 1), (14, 1), (15, 1), (16, 1), (199, 1), (512, 1)]
HEADS = [(16, 8), (8, 2)]  # Qwen3-0.6B's GQA group 2 (CUDA-core decode) and group 4 (tensor-core decode)


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "seqs", [PREFILL_NO_PREFIX, PREFILL_WITH_PREFIX, DECODE], ids=["prefill", "prefill_prefix", "decode"]
)
def test_backend_matches_reference(device: torch.device, dtype: torch.dtype, seqs: list[tuple[int, int]]) -> None:
    heads, kv_heads = HEADS[0]
    gen = torch.Generator().manual_seed(len(seqs) + sum(p for p, _ in seqs))
    meta = build_meta(seqs, PAGE_SIZE, NUM_PAGES, device, gen, is_prefill=seqs is not DECODE)
    q, kv_cache = random_inputs(meta, heads, kv_heads, dtype, device, seed=1)
    backend = make_backend(heads, kv_heads, dtype, device)
    backend.plan(meta)
    out = backend.forward(q, kv_cache, layer_idx=0, scale=HEAD_DIM**-0.5)
    err = rel_err(out, ref_attention(q, kv_cache, meta))
    assert err < TOLERANCE, f"{dtype} {seqs}: relative error {err:.3e}"


@pytest.mark.slow
def test_tensor_core_decode_matches_reference(device: torch.device) -> None:
    heads, kv_heads = HEADS[1]
    meta = build_meta(DECODE, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(3), False)
    q, kv_cache = random_inputs(meta, heads, kv_heads, torch.bfloat16, device, seed=2)
    backend = make_backend(heads, kv_heads, torch.bfloat16, device)
    assert backend.tensor_cores
    backend.plan(meta)
    err = rel_err(backend.forward(q, kv_cache, 0, HEAD_DIM**-0.5), ref_attention(q, kv_cache, meta))
    assert err < TOLERANCE, f"tensor-core decode: relative error {err:.3e}"


def packed_step(
    meta: AttentionMetadata, heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as strided views of one packed qkv (as the attention layer hands them over) and a random
    cache holding k and v at the step's slots. Returns (q, k, v, kv_cache)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(meta.num_tokens, (heads + 2 * kv_heads) * HEAD_DIM, generator=gen, device=device, dtype=dtype)
    q, k, v = qkv.view(meta.num_tokens, heads + 2 * kv_heads, HEAD_DIM).split((heads, kv_heads, kv_heads), dim=1)
    kv_cache = torch.randn(NUM_PAGES, 2, PAGE_SIZE, kv_heads, HEAD_DIM, generator=gen, device=device, dtype=dtype)
    slots = meta.slot_mapping
    kv_cache[slots // PAGE_SIZE, 0, slots % PAGE_SIZE] = k
    kv_cache[slots // PAGE_SIZE, 1, slots % PAGE_SIZE] = v
    return q, k, v, kv_cache


@pytest.mark.parametrize("kernel", ["auto", "fa2", "fa3"])
def test_ragged_prefill_matches_reference(device: torch.device, kernel: str) -> None:
    """Every kernel executor.prefill_attention can pick."""
    heads, kv_heads = HEADS[0]
    meta = build_meta(PREFILL_NO_PREFIX, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(4), True)
    q, k, v, kv_cache = packed_step(meta, heads, kv_heads, torch.bfloat16, device, seed=3)
    backend = make_backend(heads, kv_heads, torch.bfloat16, device, ragged_prefill=True, prefill_kernel=kernel)
    backend.plan(meta)
    with pytest.raises(ValueError, match="needs this step's k and v"):
        backend.forward(q, kv_cache, 0, HEAD_DIM**-0.5)
    # The cache is not read: poison it.
    out = backend.forward(q, torch.full_like(kv_cache, float("nan")), 0, HEAD_DIM**-0.5, k=k, v=v)
    err = rel_err(out, ref_attention(q, kv_cache, meta))
    assert err < TOLERANCE, f"ragged prefill: relative error {err:.3e}"


def test_ragged_plan_is_reused_for_the_same_lengths(device: torch.device) -> None:
    """A ragged plan depends only on the sequence lengths: a second step with the same lengths (new tokens,
    other pages) skips FlashInfer's plan and is still right; other lengths plan again."""
    heads, kv_heads = HEADS[0]
    backend = make_backend(heads, kv_heads, torch.bfloat16, device, ragged_prefill=True)
    for i, (seqs, plans) in enumerate([(PREFILL_NO_PREFIX, 1), (PREFILL_NO_PREFIX, 1), ([(0, 64), (0, 3)], 2)]):
        meta = build_meta(seqs, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(30 + i), True)
        q, k, v, kv_cache = packed_step(meta, heads, kv_heads, torch.bfloat16, device, seed=30 + i)
        backend.plan(meta)
        assert backend.plans == plans, f"step {i}"
        err = rel_err(backend.forward(q, kv_cache, 0, HEAD_DIM**-0.5, k=k, v=v), ref_attention(q, kv_cache, meta))
        assert err < TOLERANCE, f"step {i}: relative error {err:.3e}"


@pytest.mark.parametrize("seqs", [PREFILL_WITH_PREFIX, DECODE], ids=["prefill_prefix", "decode"])
def test_ragged_backend_reads_the_cache_when_there_is_a_prefix(device: torch.device, seqs: list) -> None:
    """With ragged prefill enabled, a step with cached prefixes (or a decode) still attends over the pages;
    the k and v it is handed (this step's only) are ignored."""
    heads, kv_heads = HEADS[0]
    meta = build_meta(seqs, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(7), seqs is not DECODE)
    q, k, v, kv_cache = packed_step(meta, heads, kv_heads, torch.bfloat16, device, seed=8)
    backend = make_backend(heads, kv_heads, torch.bfloat16, device, ragged_prefill=True)
    backend.plan(meta)
    err = rel_err(backend.forward(q, kv_cache, 0, HEAD_DIM**-0.5, k=k, v=v), ref_attention(q, kv_cache, meta))
    assert err < TOLERANCE, f"{seqs}: relative error {err:.3e}"


@pytest.mark.slow  # paged prefill correctness is in the smoke subset (prefill_prefix); this adds the profiler
def test_paged_prefill_launches_no_fill_kernel(device: torch.device) -> None:
    """FlashInfer zero-fills the output it allocates; the backend hands it an empty one (every row is
    written), so the forward launches the attention kernel only."""
    from torch.profiler import ProfilerActivity, profile

    heads, kv_heads = HEADS[0]
    meta = build_meta(PREFILL_WITH_PREFIX, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(9), True)
    q, kv_cache = random_inputs(meta, heads, kv_heads, torch.bfloat16, device, seed=9)
    backend = make_backend(heads, kv_heads, torch.bfloat16, device)
    backend.plan(meta)
    backend.forward(q, kv_cache, 0, HEAD_DIM**-0.5)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = backend.forward(q, kv_cache, 0, HEAD_DIM**-0.5)
    names = {e.key for e in prof.key_averages()}
    assert not names & {"aten::zeros", "aten::zero_", "aten::fill_"}, sorted(names)
    err = rel_err(out, ref_attention(q, kv_cache, meta))
    assert err < TOLERANCE, f"paged prefill: relative error {err:.3e}"


def test_wrong_scale_is_refused(device: torch.device) -> None:
    backend = make_backend(16, 8, torch.bfloat16, device)
    meta = build_meta(DECODE, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(5), False)
    q, kv_cache = random_inputs(meta, 16, 8, torch.bfloat16, device, seed=4)
    backend.plan(meta)
    with pytest.raises(ValueError, match="planned with scale"):
        backend.forward(q, kv_cache, 0, 0.5)


def padded_decode_plan(
    meta: AttentionMetadata, bucket: int, max_pages: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host plan inputs for `bucket` rows: the real sequences, then empty padding sequences
    (indptr repeated, last_page_len 1)."""
    pad, host = bucket - meta.num_seqs, meta.host
    assert host is not None
    indptr = torch.cat([host.kv_indptr, host.kv_indptr[-1:].repeat(pad)])
    last = torch.cat([host.kv_last_page_len, torch.ones(pad, dtype=torch.int32)])
    assert host.kv_indices.numel() <= bucket * max_pages
    return indptr, host.kv_indices, last


@pytest.mark.parametrize(("heads", "kv_heads"), [HEADS[0], pytest.param(*HEADS[1], marks=pytest.mark.slow)])
def test_graph_decode_padded_and_replanned(device: torch.device, heads: int, kv_heads: int) -> None:
    """Capture decode attention for a bucket of 8, then replay it after re-planning with other
    (padded) batches and lengths: the real rows must match the reference every time."""
    dtype, bucket, max_pages = torch.bfloat16, 8, 40
    backend = make_backend(heads, kv_heads, dtype, device)
    backend.init_decode_graphs([4, bucket], max_pages)
    kv_cache = torch.randn(NUM_PAGES, 2, PAGE_SIZE, kv_heads, HEAD_DIM, device=device, dtype=dtype)
    q_static = torch.zeros(bucket, heads, HEAD_DIM, device=device, dtype=dtype)

    capture_meta = build_meta(
        [(0, 1)] * bucket, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(6), False
    )
    backend.prepare_decode_graph(*padded_decode_plan(capture_meta, bucket, max_pages))
    backend.forward(q_static, kv_cache, 0, HEAD_DIM**-0.5)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = backend.forward(q_static, kv_cache, 0, HEAD_DIM**-0.5)

    cases = [[(3, 1), (600, 1), (15, 1)], [(0, 1)] * 8, [(16, 1), (31, 1), (1, 1), (200, 1), (47, 1)]]
    for i, seqs in enumerate(cases):
        meta = build_meta(seqs, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(10 + i), False)
        q, _ = random_inputs(meta, heads, kv_heads, dtype, device, seed=20 + i)
        q_static.zero_()
        q_static[: meta.num_seqs].copy_(q)
        backend.prepare_decode_graph(*padded_decode_plan(meta, bucket, max_pages))
        graph.replay()
        err = rel_err(out_static[: meta.num_seqs], ref_attention(q, kv_cache, meta))
        assert err < TOLERANCE, f"replay {i} ({seqs}): relative error {err:.3e}"
    with pytest.raises(ValueError, match="no CUDA-graph decode wrapper for batch 5"):
        backend.prepare_decode_graph(*padded_decode_plan(meta, 5, max_pages))



@pytest.mark.parametrize("seqs", [DECODE[:1], DECODE[3:5], DECODE], ids=["batch1", "batch2", "batch6"])
def test_small_decode_batches_take_the_triton_kernel(device: torch.device, seqs: list[tuple[int, int]]) -> None:
    """With the context bound known, decode batches up to SMALL_DECODE_MAX_BATCH run xrt's split-KV kernel
    (no FlashInfer plan), larger ones FlashInfer; both match the reference."""
    from xrt.attention.flashinfer import SMALL_DECODE_MAX_BATCH

    heads, kv_heads = HEADS[0]
    meta = build_meta(seqs, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(40 + len(seqs)), False)
    q, kv_cache = random_inputs(meta, heads, kv_heads, torch.bfloat16, device, seed=40)
    backend = make_backend(heads, kv_heads, torch.bfloat16, device, max_pages_per_seq=64)
    assert backend.small_decode is not None
    backend.plan(meta)
    small = len(seqs) <= SMALL_DECODE_MAX_BATCH
    assert backend.plans == (0 if small else 1) and (backend._active is backend.small_decode) == small
    err = rel_err(backend.forward(q, kv_cache, 0, HEAD_DIM**-0.5), ref_attention(q, kv_cache, meta))
    assert err < TOLERANCE, f"{len(seqs)} sequences: relative error {err:.3e}"


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("seqs", [DECODE[:1], DECODE[3:5], DECODE], ids=["batch1", "batch2", "batch6"])
def test_fuses_the_qk_norm_rope_on_its_small_decode_only_where_asked(device: torch.device,
                                                                     seqs: list[tuple[int, int]], fuse: bool) -> None:
    """fuse_qk_norm_rope (executor.fuse_qk_norm_rope): decode batches on the Triton kernel take the layer's raw qkv;
    FlashInfer's batches, prefills and a backend without the option never do, and refuse forward_fused."""
    from xrt.attention.flashinfer import SMALL_DECODE_MAX_BATCH

    heads, kv_heads = HEADS[0]
    backend = make_backend(heads, kv_heads, torch.bfloat16, device, max_pages_per_seq=64, ragged_prefill=True,
                           fuse_qk_norm_rope=fuse)
    meta = build_meta(seqs, PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(41), False)
    backend.plan(meta)
    assert backend.fuses_qk_norm_rope() == (fuse and len(seqs) <= SMALL_DECODE_MAX_BATCH)
    backend.plan(build_meta([(0, 5)], PAGE_SIZE, NUM_PAGES, device, torch.Generator().manual_seed(42), True))
    assert not backend.fuses_qk_norm_rope()
    with pytest.raises(RuntimeError, match="does not fuse the q/k norm and RoPE"):
        backend.forward_fused(torch.empty(0), None, torch.empty(0), 0, HEAD_DIM**-0.5)
