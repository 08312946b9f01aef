"""The CUDA-graph executor's parts on CPU: a clear error without CUDA, the host staging of a decode step
padded up to its bucket (the padding rows the attention needs well-formed metadata for) from a StepInput or
from the engine's DecodeBatch, the torch reference's graph hooks, and the decode graph manager built from
its real parts (tiny model, float32, the torch reference backend, "graphs" that re-run on replay) against
the eager path: logits, in-graph greedy tokens, launches chained on the device, padding writing no KV."""

from __future__ import annotations

import random

import attrs
import numpy as np
import pytest
import torch

from xrt.attention.flashinfer import FlashInferUnavailable, unsupported_reason
from xrt.attention.torch_ref import TorchRefBackend
from xrt.config import CacheArgs, Device, ExecutorArgs, ExecutorKind, LoadFormat, XrtConfig
from xrt.executor.buffers import StagedBuffer
from xrt.executor.factory import build_runner
from xrt.executor.graphs.capture import RerunCapture
from xrt.executor.graphs.decode_inputs import DecodeStaging, decode_batch, stage_capture_rows, stage_decode
from xrt.executor.runner import ModelRunner
from xrt.executor.step import DecodeBatch, SeqChunk, StepInput
from xrt.models.tiny import tiny_model_args
from xrt.ops import reference


def test_cudagraph_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = XrtConfig(executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH))
    for build in (build_runner, ModelRunner):
        with pytest.raises(ValueError, match=r"^executor.kind: cudagraph needs a CUDA device"):
            build(cfg)


def test_cudagraph_on_cpu_device_is_a_clear_error() -> None:
    cfg = XrtConfig(device=Device.CPU, executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH))
    with pytest.raises(ValueError, match=r"^executor.kind: cudagraph needs a CUDA device"):
        build_runner(cfg)


def test_flashinfer_unsupported_reasons() -> None:
    assert issubclass(FlashInferUnavailable, ImportError)  # the runner falls back to the torch reference
    for dtype, head_dim, words in [(torch.float32, 128, "float32"), (torch.bfloat16, 16, "head_dim")]:
        reason = unsupported_reason(dtype, head_dim)
        assert reason is not None
        assert words in reason or "not installed" in reason


def junk_staging(bucket: int, max_pages: int) -> DecodeStaging:
    # Filled with junk: staging must overwrite every row it hands to the graph.
    st = DecodeStaging.zeros(bucket, max_pages)
    for a in (st.rows, st.kv_indptr, st.kv_last_page_len, st.kv_indices):
        a.fill(77)
    return st


def test_stage_decode_real_rows_then_empty_padding_rows() -> None:
    ps = 4
    step = StepInput(
        is_prefill=False,
        seqs=[
            SeqChunk(token_ids=[11], start_pos=0, page_table=[9]),  # first token of page 9
            SeqChunk(token_ids=[12], start_pos=4, page_table=[3, 5, 6]),  # first slot of its 2nd page
            SeqChunk(token_ids=[13], start_pos=7, page_table=[2, 8]),  # last slot of its 2nd page
        ],
    )
    st = junk_staging(8, 3)
    n = stage_decode(st, decode_batch(step), 8, ps, loop_max_rows=8)
    assert n == 5
    assert st.rows.tolist() == [
        [11, 12, 13, 0, 0, 0, 0, 0],
        [0, 4, 7, 0, 0, 0, 0, 0],
        [36, 20, 35, -1, -1, -1, -1, -1],
        [-1] * 8,
    ]
    assert st.kv_indptr.tolist() == [0, 1, 3, 5, 5, 5, 5, 5, 5]
    assert st.kv_last_page_len.tolist() == [1, 1, 4, 1, 1, 1, 1, 1]
    assert st.kv_indices[:n].tolist() == [9, 3, 5, 2, 8]


def test_stage_decode_full_bucket_has_no_padding() -> None:
    step = StepInput(is_prefill=False, seqs=[SeqChunk([5], 2, [1]), SeqChunk([6], 0, [4])])
    st = junk_staging(2, 1)
    assert stage_decode(st, decode_batch(step), 2, 16, loop_max_rows=0) == 2
    assert st.rows.tolist() == [[5, 6], [2, 0], [18, 64], [-1, -1]]
    assert st.kv_indptr.tolist() == [0, 1, 2]
    assert st.kv_last_page_len.tolist() == [3, 1]


def test_stage_decode_rejects_bad_rows() -> None:
    st = junk_staging(4, 2)
    for loop_max_rows in (8, 0):  # the per-row loop, the whole-array ops
        with pytest.raises(ValueError, match=r"row 1: position 4 needs 2 KV pages, its page table has 1"):
            step = StepInput(False, [SeqChunk([1], 0, [3]), SeqChunk([1], 4, [0])])
            stage_decode(st, decode_batch(step), 4, 4, loop_max_rows)
    with pytest.raises(ValueError, match=r"position 8 needs 3 KV pages per sequence; the staging buffers hold 2"):
        stage_decode(st, decode_batch(StepInput(False, [SeqChunk([1], 8, [0, 1, 2])])), 4, 4, 8)
    with pytest.raises(ValueError, match="2 sequences do not fit bucket 1"):
        stage_decode(st, decode_batch(StepInput(False, [SeqChunk([1], 0, [0])] * 2)), 1, 4, 8)
    with pytest.raises(ValueError, match=r"step.seqs\[1\]: a decode chunk carries exactly one token, got 2"):
        decode_batch(StepInput(False, [SeqChunk([1], 0, [0]), SeqChunk([1, 2], 0, [0])]))
    tables = np.zeros((1, 3), dtype=np.int32)
    with pytest.raises(ValueError, match="position 12 needs 4 KV pages per sequence; the staging buffers hold 2"):
        stage_decode(st, DecodeBatch([1], [-1], [12], [0], tables), 4, 4, 8)


def test_stage_decode_from_page_table_rows_then_padding() -> None:
    st = junk_staging(8, 4)
    tables = np.array([[9, 0, 0], [3, 5, 6], [2, 8, 0], [7, 7, 7]], dtype=np.int32)
    n = stage_decode(st, DecodeBatch([11, 0, 13], [-1, 2, -1], [0, 4, 7], [0, 1, 2], tables), 5, 4, 8)
    assert n == 5
    assert st.rows[:, :5].tolist() == [[11, 0, 13, 0, 0], [0, 4, 7, 0, 0], [36, 20, 35, -1, -1], [-1, 2, -1, -1, -1]]
    assert st.kv_indptr[:6].tolist() == [0, 1, 3, 5, 5, 5]
    assert st.kv_last_page_len[:5].tolist() == [1, 1, 4, 1, 1]
    assert st.kv_indices[:n].tolist() == [9, 3, 5, 2, 8]


@pytest.mark.parametrize("n", [1, 3, 8, 9, 20])
@pytest.mark.parametrize("loop_max_rows", [0, 8, 64])
def test_every_staging_path_writes_the_same(n: int, loop_max_rows: int) -> None:
    """The per-row loop and the vectorized staging of a DecodeBatch write what the StepInput of the same
    sequences stages."""
    rng = np.random.default_rng(n)
    ps, width, bucket = 4, 6, 24
    tables = rng.permutation(200)[: 30 * width].reshape(30, width).astype(np.int32)
    rows = rng.choice(30, size=n, replace=False).tolist()
    positions = rng.integers(0, ps * width, size=n).tolist()
    tokens = rng.integers(0, 1000, size=n).tolist()
    chunks = [SeqChunk([t], p, tables[r].tolist()) for t, p, r in zip(tokens, positions, rows, strict=True)]
    want = junk_staging(bucket, width)
    want_n = stage_decode(want, decode_batch(StepInput(False, chunks)), bucket, ps, loop_max_rows)
    got = junk_staging(bucket, width)
    got_n = stage_decode(got, DecodeBatch(tokens, [-1] * n, positions, rows, tables), bucket, ps, loop_max_rows)
    assert got_n == want_n
    for a, b in [(got.rows, want.rows), (got.kv_indptr, want.kv_indptr), (got.kv_last_page_len, want.kv_last_page_len)]:
        assert a.tolist() == b.tolist()
    assert got.kv_indices[:got_n].tolist() == want.kv_indices[:want_n].tolist()


def test_capture_rows_are_one_token_sequences_that_write_nothing() -> None:
    st = junk_staging(4, 2)
    assert stage_capture_rows(st, 3) == 3
    assert st.rows[:, :3].tolist() == [[0] * 3, [0] * 3, [-1] * 3, [-1] * 3]
    assert st.kv_indptr[:4].tolist() == [0, 1, 2, 3] and st.kv_indices[:3].tolist() == [0, 0, 0]
    assert st.kv_last_page_len[:3].tolist() == [1, 1, 1]


def test_staged_buffer_uploads_leading_rows() -> None:
    buf = StagedBuffer((4, 3), torch.int64, torch.device("cpu"))
    assert not buf.host.is_pinned()  # pinning needs CUDA
    buf.np[:] = np.arange(12).reshape(4, 3)
    assert buf.upload(2).tolist() == [[0, 1, 2], [3, 4, 5]] and buf.dev[2:].abs().sum() == 0
    assert torch.equal(buf.upload(), buf.host)
    block = torch.zeros(5, 3, dtype=torch.int64)
    into = StagedBuffer((4, 3), torch.int64, torch.device("cpu"), dev=block[1:])
    into.np.fill(7)
    into.upload()
    assert block[0].tolist() == [0, 0, 0] and (block[1:] == 7).all()


def test_torch_reference_prefill_graph_attends_over_this_steps_k_and_v() -> None:
    """Its prefill-graph attention (each sequence causal over its own k/v, from the static qo_indptr) equals
    the paged reference over a cache holding the same k/v."""
    gen = torch.Generator().manual_seed(0)
    lengths, heads, kv_heads, d, ps = [5, 0, 3, 8], 4, 2, 16, 4
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, d, generator=gen) for h in (heads, kv_heads, kv_heads))
    qo = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int32)
    backend = TorchRefBackend()
    static = backend.init_prefill_graphs([(len(lengths), t)])
    backend.prepare_prefill_graph(qo)
    assert static[: len(qo)].tolist() == qo.tolist()
    got = backend.forward(q, torch.empty(0), 0, 0.25, k, v)
    pages = [-(-n // ps) for n in lengths]
    cache = torch.zeros(sum(pages), 2, ps, kv_heads, d)
    slots = torch.cat([p0 * ps + torch.arange(n) for p0, n in zip(np.cumsum([0, *pages[:-1]]), lengths, strict=True)])
    cache[slots // ps, 0, slots % ps], cache[slots // ps, 1, slots % ps] = k, v
    last = torch.tensor([n - (p - 1) * ps if p else 1 for n, p in zip(lengths, pages, strict=True)], dtype=torch.int32)
    kv_indptr = torch.tensor(np.cumsum([0, *pages]), dtype=torch.int32)
    want = reference.paged_attention(q, cache, qo, kv_indptr, torch.arange(sum(pages), dtype=torch.int32), last, 0.25)
    torch.testing.assert_close(got, want)


# -- the decode graph manager on CPU --------------------------------------------------------------------

PAGE_SIZE = 4
NUM_PAGES = 256


def config(kind: ExecutorKind, **executor: object) -> XrtConfig:
    model = attrs.evolve(tiny_model_args(), load_format=LoadFormat.DUMMY, max_model_len=64)
    return XrtConfig(
        model=model, device=Device.CPU, executor=ExecutorArgs(kind=kind, max_batch=8, **executor),  # type: ignore[arg-type]
        cache=CacheArgs(page_size=PAGE_SIZE, num_pages=NUM_PAGES), seed=5,
    )


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    runner = ModelRunner(config(ExecutorKind.CUDAGRAPH), capture=RerunCapture())
    with torch.no_grad():
        for p in runner.model.parameters():
            if p.dim() == 2:
                p.mul_(15.0)  # dummy weights this wide make every token of the context matter
    return runner


def random_decode_step(batch: int, rng: random.Random, max_pos: int = 60) -> StepInput:
    pages = list(range(NUM_PAGES))
    rng.shuffle(pages)
    seqs = []
    for _ in range(batch):
        pos = rng.randrange(0, max_pos)
        k = pos // PAGE_SIZE + 1
        table, pages = pages[:k], pages[k:]
        seqs.append(SeqChunk([rng.randrange(1000)], pos, table, needs_logits=rng.random() < 0.8 or batch == 1))
    return StepInput(False, seqs)


def test_graphs_for_every_bucket_and_the_runner_contract(runner: ModelRunner) -> None:
    assert runner.decode_graphs is not None and sorted(runner.decode_graphs.graphs) == [1, 2, 4, 8]
    assert runner.prefill_graphs is None  # executor.prefill_graph is off
    assert runner.decode_capacity == 8 and runner.vocab_size == runner.model.lm_head.num_embeddings
    no_argmax = ModelRunner(config(ExecutorKind.CUDAGRAPH, capture_sampling=False, buckets=[2]), capture=RerunCapture())
    assert no_argmax.decode_capacity == 0
    with pytest.raises(NotImplementedError, match="decode_capacity 0"):
        no_argmax.launch_decode(DecodeBatch([1], [-1], [0], [0], np.zeros((1, 1), np.int32)), None)


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8])
def test_replayed_decode_matches_eager(runner: ModelRunner, batch: int) -> None:
    """A replay padded up to its bucket gives the eager path's logits for the rows that want them, and the
    in-graph greedy tokens of those rows."""
    step = random_decode_step(batch, random.Random(batch))
    want = runner.execute_eager(step).clone()
    got = runner.execute(step)
    assert got.shape == want.shape == (sum(c.needs_logits for c in step.seqs), runner.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert runner.last_argmax is not None and torch.equal(runner.last_argmax, want.argmax(dim=-1))


def test_batch_above_the_largest_bucket_runs_eager(runner: ModelRunner) -> None:
    step = random_decode_step(9, random.Random(9))
    torch.testing.assert_close(runner.execute(step), runner.execute_eager(step))
    assert runner.last_argmax is None


def test_padding_rows_write_no_kv(runner: ModelRunner) -> None:
    kv = runner.kv_cache.tensor
    kv.zero_()
    step = random_decode_step(3, random.Random(30))  # padded to 4
    runner.execute(step)
    written = kv[0].abs().sum(dim=(1, 3, 4)).flatten() != 0  # [pages * page_size] per slot
    want = torch.zeros_like(written)
    for chunk in step.seqs:
        want[chunk.page_table[chunk.start_pos // PAGE_SIZE] * PAGE_SIZE + chunk.start_pos % PAGE_SIZE] = True
    assert torch.equal(written, want)


def test_launched_step_takes_its_tokens_from_the_previous_launch(runner: ModelRunner) -> None:
    """Two launches, the second reading its input tokens (in permuted rows) from the first's in-graph argmax,
    against two eager steps fed through the host."""
    rng = random.Random(5)
    batch = 5
    pages = list(range(NUM_PAGES))
    rng.shuffle(pages)
    tables = np.zeros((batch, runner.max_pages_per_seq), dtype=np.int32)
    positions = [rng.randrange(0, 60) for _ in range(batch)]
    tokens = [rng.randrange(1000) for _ in range(batch)]
    for i, pos in enumerate(positions):
        k = (pos + 1) // PAGE_SIZE + 1  # covers the second step too
        tables[i, :k], pages = pages[:k], pages[k:]

    def eager_step(ids: list[int], shift: int) -> list[int]:
        rows = zip(ids, positions, tables.tolist(), strict=True)
        seqs = [SeqChunk([t], p + shift, table) for t, p, table in rows]
        return runner.execute_eager(StepInput(False, seqs)).argmax(dim=-1).tolist()

    want1 = eager_step(tokens, 0)
    want2 = eager_step(want1, 1)
    first = runner.launch_decode(DecodeBatch(tokens, [-1] * batch, positions, list(range(batch)), tables), None)
    perm = [3, 0, 4, 1, 2]
    second = runner.launch_decode(DecodeBatch([0] * batch, perm, [positions[j] + 1 for j in perm], perm, tables), first)
    assert first.tokens() == want1
    assert second.tokens() == [want2[j] for j in perm]
    with pytest.raises(RuntimeError, match="not the previous forward pass"):
        runner.launch_decode(DecodeBatch([0], [0], [0], [0], tables), first)
    with pytest.raises(ValueError, match="9 sequences exceed the largest graph"):
        runner.launch_decode(DecodeBatch([0] * 9, [-1] * 9, [0] * 9, [0] * 9, tables), None)
