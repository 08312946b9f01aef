"""The CUDA-graph executor's CPU-side behaviour: a clear error without CUDA, and the host staging of
a decode step padded up to its bucket (the padding rows FlashInfer needs well-formed metadata for),
from a StepInput or from the engine's per-sequence arrays (overlapped decoding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xrt.attention.flashinfer import FlashInferUnavailable, unsupported_reason
from xrt.config import Device, ExecutorArgs, ExecutorKind, XrtConfig
from xrt.executor.cudagraph import CudaGraphRunner, stage_decode
from xrt.executor.prepare import DecodeStaging, pad_decode_rows, stage_decode_rows
from xrt.executor.step import SeqChunk, StepInput


def test_cudagraph_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = XrtConfig(executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH))
    with pytest.raises(ValueError, match=r"^executor.kind: cudagraph needs a CUDA device"):
        CudaGraphRunner(cfg)


def test_cudagraph_on_cpu_device_is_a_clear_error() -> None:
    cfg = XrtConfig(device=Device.CPU, executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH))
    with pytest.raises(ValueError, match=r"^executor.kind: cudagraph needs a CUDA device"):
        CudaGraphRunner(cfg)


def test_flashinfer_unsupported_reasons() -> None:
    assert issubclass(FlashInferUnavailable, ImportError)  # the runner falls back to the torch reference
    for dtype, head_dim, words in [(torch.float32, 128, "float32"), (torch.bfloat16, 16, "head_dim")]:
        reason = unsupported_reason(dtype, head_dim)
        assert reason is not None
        assert words in reason or "not installed" in reason


def arrays(bucket: int, max_pages: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # Filled with junk: staging must overwrite every row it hands to the graph.
    return (
        np.full((3, bucket), 77, dtype=np.int64),
        np.full(bucket + 1, 77, dtype=np.int32),
        np.full(bucket, 77, dtype=np.int32),
        np.full(bucket * max_pages, 77, dtype=np.int32),
    )


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
    tokens, indptr, last, indices = arrays(8, 3)
    n = stage_decode(step, 8, ps, 3, tokens, indptr, last, indices)
    assert n == 5
    assert tokens[0].tolist() == [11, 12, 13, 0, 0, 0, 0, 0]
    assert tokens[1].tolist() == [0, 4, 7, 0, 0, 0, 0, 0]
    assert tokens[2].tolist() == [36, 20, 35, -1, -1, -1, -1, -1]
    assert indptr.tolist() == [0, 1, 3, 5, 5, 5, 5, 5, 5]
    assert last.tolist() == [1, 1, 4, 1, 1, 1, 1, 1]
    assert indices[:n].tolist() == [9, 3, 5, 2, 8]


def test_stage_decode_full_bucket_has_no_padding() -> None:
    step = StepInput(is_prefill=False, seqs=[SeqChunk([5], 2, [1]), SeqChunk([6], 0, [4])])
    tokens, indptr, last, indices = arrays(2, 1)
    assert stage_decode(step, 2, 16, 1, tokens, indptr, last, indices) == 2
    assert tokens.tolist() == [[5, 6], [2, 0], [18, 64]]
    assert indptr.tolist() == [0, 1, 2]
    assert last.tolist() == [3, 1]


def test_stage_decode_rejects_bad_chunks() -> None:
    tokens, indptr, last, indices = arrays(4, 2)
    with pytest.raises(ValueError, match=r"step.seqs\[0\]: a decode chunk needs one token and 2 pages"):
        stage_decode(StepInput(False, [SeqChunk([1], 4, [0])]), 4, 4, 2, tokens, indptr, last, indices)
    with pytest.raises(ValueError, match=r"step.seqs\[0\]: position 8 needs 3 KV pages"):
        stage_decode(StepInput(False, [SeqChunk([1], 8, [0, 1, 2])]), 4, 4, 2, tokens, indptr, last, indices)
    with pytest.raises(ValueError, match="do not fit bucket 1"):
        stage_decode(StepInput(False, [SeqChunk([1], 0, [0])] * 2), 1, 4, 2, tokens, indptr, last, indices)


def test_stage_decode_rows_from_page_table_rows_then_padding() -> None:
    st = DecodeStaging.zeros(8, 4)
    st.rows.fill(77)
    tables = np.array([[9, 0, 0], [3, 5, 6], [2, 8, 0], [7, 7, 7]], dtype=np.int32)
    n = stage_decode_rows(st, 4, [11, 0, 13], [-1, 2, -1], [0, 4, 7], tables, [0, 1, 2])
    pad_decode_rows(st, 3, 5)
    assert n == 5
    assert st.rows[:, :5].tolist() == [[11, 0, 13, 0, 0], [0, 4, 7, 0, 0], [36, 20, 35, -1, -1], [-1, 2, -1, -1, -1]]
    assert st.kv_indptr[:6].tolist() == [0, 1, 3, 5, 5, 5]
    assert st.kv_last_page_len[:5].tolist() == [1, 1, 4, 1, 1]
    assert st.kv_indices[:n].tolist() == [9, 3, 5, 2, 8]
    with pytest.raises(ValueError, match="position 12 needs 4 KV pages"):
        stage_decode_rows(st, 4, [1], [-1], [12], tables, [3])


@pytest.mark.parametrize("n", [1, 3, 8, 9, 20])
def test_stage_decode_rows_agrees_with_stage_decode(n: int) -> None:
    """Both stagings (the small-batch loop and the vectorized one) write what stage_decode writes
    for the same sequences given as a StepInput."""
    rng = np.random.default_rng(n)
    ps, width, bucket = 4, 6, 24
    tables = rng.permutation(200)[: 30 * width].reshape(30, width).astype(np.int32)
    rows = rng.choice(30, size=n, replace=False).tolist()
    positions = rng.integers(0, ps * width, size=n).tolist()
    tokens = rng.integers(0, 1000, size=n).tolist()
    chunks = [SeqChunk([t], p, tables[r].tolist()) for t, p, r in zip(tokens, positions, rows, strict=True)]
    step = StepInput(False, chunks)
    want_tokens, want_indptr, want_last, want_indices = arrays(bucket, width)
    want_n = stage_decode(step, bucket, ps, width, want_tokens, want_indptr, want_last, want_indices)
    st = DecodeStaging.zeros(bucket, width)
    st.rows.fill(77)
    st.kv_indices.fill(77)
    got_n = stage_decode_rows(st, ps, tokens, [-1] * n, positions, tables, rows)
    pad_decode_rows(st, n, bucket)
    assert got_n == want_n
    assert st.rows[:3].tolist() == want_tokens.tolist()
    assert st.rows[3].tolist() == [-1] * bucket
    assert st.kv_indptr.tolist() == want_indptr.tolist()
    assert st.kv_last_page_len.tolist() == want_last.tolist()
    assert st.kv_indices[:got_n].tolist() == want_indices[:want_n].tolist()
