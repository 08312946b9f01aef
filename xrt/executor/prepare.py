"""Turn a StepInput (plain Python) into the token tensor and the attention metadata of one step, and
stage a decode step from per-sequence arrays into the host buffers of a runner that launches it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from xrt.attention.metadata import AttentionMetadata
from xrt.executor.step import StepInput


def build_metadata(
    step: StepInput, page_size: int, device: torch.device | str
) -> tuple[torch.Tensor, AttentionMetadata]:
    """(input_ids [T] int64 on device, metadata). Raises ValueError naming the chunk when a
    page table is too short for its tokens or a decode chunk does not carry exactly one token."""
    num_seqs = len(step.seqs)
    qo_indptr = np.zeros(num_seqs + 1, dtype=np.int32)
    kv_indptr = np.zeros(num_seqs + 1, dtype=np.int32)
    last_page_len = np.zeros(num_seqs, dtype=np.int32)
    seq_lens = np.zeros(num_seqs, dtype=np.int32)
    token_ids: list[int] = []
    positions: list[np.ndarray] = []
    slots: list[np.ndarray] = []
    kv_indices: list[int] = []
    logits_indices: list[int] = []
    for i, chunk in enumerate(step.seqs):
        n = len(chunk.token_ids)
        if not step.is_prefill and n != 1:
            raise ValueError(f"step.seqs[{i}]: a decode chunk carries exactly one token, got {n}")
        if chunk.needs_logits and n == 0:
            raise ValueError(f"step.seqs[{i}]: needs_logits with no tokens")
        seq_len = chunk.start_pos + n
        num_pages = -(-seq_len // page_size)
        if len(chunk.page_table) < num_pages:
            raise ValueError(
                f"step.seqs[{i}]: page_table has {len(chunk.page_table)} pages, {seq_len} tokens need {num_pages}"
            )
        pages = np.asarray(chunk.page_table[:num_pages], dtype=np.int64)
        pos = np.arange(chunk.start_pos, seq_len, dtype=np.int64)
        token_ids.extend(chunk.token_ids)
        positions.append(pos)
        slots.append(pages[pos // page_size] * page_size + pos % page_size)
        kv_indices.extend(chunk.page_table[:num_pages])
        qo_indptr[i + 1] = qo_indptr[i] + n
        kv_indptr[i + 1] = kv_indptr[i] + num_pages
        last_page_len[i] = seq_len - (num_pages - 1) * page_size if num_pages else 0
        seq_lens[i] = seq_len
        if chunk.needs_logits:
            logits_indices.append(int(qo_indptr[i + 1]) - 1)

    # Two host -> device copies per step (one per dtype) instead of one per tensor.
    n_tok, n_logits = len(token_ids), len(logits_indices)
    int64s = [np.asarray(token_ids, dtype=np.int64), *_cat(positions), *_cat(slots),
              np.asarray(logits_indices, dtype=np.int64)]
    int32s = [qo_indptr, kv_indptr, np.asarray(kv_indices, dtype=np.int32), last_page_len, seq_lens]
    h64 = torch.from_numpy(np.concatenate(int64s))
    h32 = torch.from_numpy(np.concatenate(int32s))
    d64, d32 = h64.to(device), h32.to(device)
    ids, pos, slot, logit_rows = d64.split([n_tok, n_tok, n_tok, n_logits])
    sizes = [num_seqs + 1, num_seqs + 1, len(kv_indices), num_seqs, num_seqs]
    qo_d, kv_d, idx_d, last_d, lens_d = d32.split(sizes)
    qo_h, kv_h, idx_h, last_h, lens_h = h32.split(sizes)
    meta = AttentionMetadata(
        is_prefill=step.is_prefill,
        num_seqs=num_seqs,
        num_tokens=n_tok,
        positions=pos,
        slot_mapping=slot,
        qo_indptr=qo_d,
        kv_indptr=kv_d,
        kv_indices=idx_d,
        kv_last_page_len=last_d,
        seq_lens=lens_d,
        qo_indptr_host=qo_h,
        kv_indptr_host=kv_h,
        kv_indices_host=idx_h,
        kv_last_page_len_host=last_h,
        seq_lens_host=lens_h,
        logits_indices=logit_rows,
        has_prefix=any(chunk.start_pos > 0 for chunk in step.seqs),
        page_size=page_size,
    )
    return ids, meta


def _cat(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.concatenate(parts)] if parts else []


@dataclass
class DecodeStaging:
    """Host arrays of one decode step for a runner that launches decode steps itself (the CUDA-graph
    runner's are views of pinned memory, reused every step). Rows [0, n) are the real sequences.

    rows [4, >= max_batch] int64: token id, position, KV slot, and source: -1 takes the token id
        from row 0; r >= 0 takes the greedy token of row r of the previous decode launch, which
        stays on the device (the host has not seen it yet).
    kv_indptr [>= max_batch + 1], kv_last_page_len [>= max_batch], kv_indices: int32, FlashInfer CSR.
    """

    rows: np.ndarray
    kv_indptr: np.ndarray
    kv_last_page_len: np.ndarray
    kv_indices: np.ndarray

    @classmethod
    def zeros(cls, max_batch: int, max_pages_per_seq: int) -> DecodeStaging:
        return cls(
            rows=np.zeros((4, max_batch), dtype=np.int64),
            kv_indptr=np.zeros(max_batch + 1, dtype=np.int32),
            kv_last_page_len=np.ones(max_batch, dtype=np.int32),
            kv_indices=np.zeros(max_batch * max_pages_per_seq, dtype=np.int32),
        )


def stage_decode_rows(
    st: DecodeStaging,
    page_size: int,
    token_ids: list[int],
    sources: list[int],
    positions: list[int],
    page_tables: np.ndarray,
    table_rows: list[int],
) -> int:
    """Fill rows [0, n) of `st` for n sequences, each feeding one token at `positions[i]`, whose page
    tables are rows `table_rows` of `page_tables` ([rows, pages] int32, a sequence's pages in order).
    No Python loop over pages. Returns the number of page indices written."""
    n = len(positions)
    st.kv_indptr[0] = 0
    if n == 0:
        return 0
    width = max(positions) // page_size + 1
    if width > page_tables.shape[1] or n * width > len(st.kv_indices):
        raise ValueError(
            f"position {max(positions)} needs {width} KV pages per sequence; the staging buffers hold "
            f"{min(page_tables.shape[1], len(st.kv_indices) // n)}"
        )
    if n <= _SMALL_BATCH:
        return _stage_rows_small(st, page_size, token_ids, sources, positions, page_tables, table_rows)
    pos = np.asarray(positions, dtype=np.int64)
    num_pages = pos // page_size + 1
    tables = page_tables[table_rows, :width]  # [n, width]: one gather of every page table
    st.rows[0, :n] = token_ids
    st.rows[1, :n] = pos
    st.rows[2, :n] = tables[np.arange(n), num_pages - 1] * page_size + pos % page_size
    st.rows[3, :n] = sources
    np.cumsum(num_pages, out=st.kv_indptr[1 : n + 1])
    total = int(st.kv_indptr[n])
    st.kv_indices[:total] = tables[np.arange(width) < num_pages[:, None]]
    st.kv_last_page_len[:n] = pos % page_size + 1
    return total


# Up to this many sequences a loop of a few numpy writes per row beats the vectorized ops' fixed cost.
_SMALL_BATCH = 8


def _stage_rows_small(
    st: DecodeStaging,
    page_size: int,
    token_ids: list[int],
    sources: list[int],
    positions: list[int],
    page_tables: np.ndarray,
    table_rows: list[int],
) -> int:
    total = 0
    for i, (token, source, pos, row) in enumerate(zip(token_ids, sources, positions, table_rows, strict=True)):
        k = pos // page_size + 1
        pages = page_tables[row, :k]
        st.kv_indices[total : total + k] = pages
        total += k
        st.rows[:, i] = (token, pos, int(pages[-1]) * page_size + pos % page_size, source)
        st.kv_indptr[i + 1] = total
        st.kv_last_page_len[i] = pos % page_size + 1
    return total


def pad_decode_rows(st: DecodeStaging, n: int, bucket: int) -> None:
    """Rows [n, bucket) become empty sequences: token 0 from the host, position 0, slot -1 (no KV
    write), kv_indptr repeated, last_page_len 1."""
    st.rows[:, n:bucket] = [[0], [0], [-1], [-1]]
    st.kv_indptr[n + 1 : bucket + 1] = st.kv_indptr[n]
    st.kv_last_page_len[n:bucket] = 1
