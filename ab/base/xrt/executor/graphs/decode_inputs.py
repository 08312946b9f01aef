"""The decode graphs' inputs: how a decode step is staged on the host (one function for a StepInput and
for the engine's DecodeBatch), the static device inputs it is uploaded into, and the read-back of the
greedy tokens a replay leaves on the device.

Padding rows are empty sequences: token 0, position 0, slot -1 (no KV write), kv_indptr repeated and
last_page_len 1, so the attention has well-formed metadata for every row the graph was captured with
(missing per-row metadata for padding rows is the illegal-memory-access bug of xLLM's first graph
executor)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from xrt.executor.buffers import Event, StagedBuffer, device_event, host_tensor
from xrt.executor.step import DecodeBatch, StepInput


@dataclass
class DecodeStaging:
    """Host arrays of one decode step (the graph runner's are numpy views of pinned memory, reused every
    step). Rows [0, n) are the real sequences, [n, bucket) padding.

    rows [4, >= max_batch] int64: token id, position, KV slot, and source: -1 takes the token id from
        row 0; r >= 0 takes the greedy token of row r of the previous decode launch, which stays on the
        device (the host has not seen it yet).
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


def decode_batch(step: StepInput) -> DecodeBatch:
    """A decode StepInput as a DecodeBatch: every token from the host, each chunk's page table its own row."""
    seqs = step.seqs
    try:
        token_ids = [t for (t,) in (c.token_ids for c in seqs)]  # exactly one token each, or ValueError
    except ValueError:
        i, bad = next((i, len(c.token_ids)) for i, c in enumerate(seqs) if len(c.token_ids) != 1)
        raise ValueError(f"step.seqs[{i}]: a decode chunk carries exactly one token, got {bad}") from None
    n = len(seqs)
    return DecodeBatch(token_ids, [-1] * n, [c.start_pos for c in seqs], range(n), [c.page_table for c in seqs])


def stage_decode(st: DecodeStaging, batch: DecodeBatch, bucket: int, page_size: int, loop_max_rows: int) -> int:
    """Write rows [0, n) of `st` from the batch (row i feeds one token at positions[i], its pages row
    table_rows[i] of page_tables) and make rows [n, bucket) padding. Up to loop_max_rows rows (page tables
    as lists: LIST_LOOP_FACTOR times that) a loop of a few numpy writes per row, cheaper than the
    vectorized ops' fixed cost; above, whole-array ops. Returns the number of page indices written."""
    n, ps = len(batch), page_size
    if n > bucket:
        raise ValueError(f"{n} sequences do not fit bucket {bucket}")
    st.kv_indptr[0] = 0
    total = 0
    if n:
        tables = batch.page_tables
        width = max(batch.positions) // ps + 1
        room = len(st.kv_indices) // st.rows.shape[1]  # max_pages_per_seq the buffers were made for
        array = isinstance(tables, np.ndarray)
        if array:
            room = min(room, tables.shape[1])
        if width > room:
            raise ValueError(
                f"position {max(batch.positions)} needs {width} KV pages per sequence; the staging buffers hold {room}"
            )
        if n <= (loop_max_rows if array else LIST_LOOP_FACTOR * loop_max_rows):
            total = _stage_loop(st, batch, tables, ps)
        else:
            total = _stage_vectorized(st, batch, tables, width, ps)
    if n < bucket:
        st.rows[:, n:bucket] = PADDING_ROW
        st.kv_indptr[n + 1 : bucket + 1] = total
        st.kv_last_page_len[n:bucket] = 1
    return total


# Page tables as lists (a StepInput's) are concatenated before the whole-array ops, which moves the
# loop's break-even up: on a CPU test machine the loop was faster to ~30 rows, 1.6x slower at 100.
LIST_LOOP_FACTOR = 4

# A padding row: token 0 from the host (source -1), position 0, slot -1. An array: broadcasting it is
# cheaper than converting a nested list every step.
PADDING_ROW = np.array([[0], [0], [-1], [-1]], dtype=np.int64)


def _short_table(i: int, pos: int, k: int, have: int) -> ValueError:
    return ValueError(f"row {i}: position {pos} needs {k} KV pages, its page table has {have}")


def _stage_loop(st: DecodeStaging, batch: DecodeBatch, tables: np.ndarray | Sequence[Sequence[int]], ps: int) -> int:
    total = 0
    array = isinstance(tables, np.ndarray)  # rows as wide as the widest sequence: checked by the caller
    rows = zip(batch.token_ids, batch.sources, batch.positions, batch.table_rows, strict=True)
    for i, (token, source, pos, row) in enumerate(rows):
        k = pos // ps + 1
        pages = tables[row, :k] if array else tables[row][:k]  # type: ignore[call-overload]
        if not array and len(pages) < k:
            raise _short_table(i, pos, k, len(pages))
        st.kv_indices[total : total + k] = pages
        total += k
        st.rows[:, i] = (token, pos, int(pages[-1]) * ps + pos % ps, source)
        st.kv_indptr[i + 1] = total
        st.kv_last_page_len[i] = pos % ps + 1
    return total


def _stage_vectorized(
    st: DecodeStaging, batch: DecodeBatch, tables: np.ndarray | Sequence[Sequence[int]], width: int, ps: int
) -> int:
    n = len(batch)
    pos = np.asarray(batch.positions, dtype=np.int64)
    num_pages = pos // ps + 1
    np.cumsum(num_pages, out=st.kv_indptr[1 : n + 1])
    total = int(st.kv_indptr[n])
    if isinstance(tables, np.ndarray):
        rows = tables[batch.table_rows, :width]  # [n, width]: one gather of every page table
        st.kv_indices[:total] = rows[np.arange(width) < num_pages[:, None]]
    else:
        counts = num_pages.tolist()
        runs = (tables[r][:k] for r, k in zip(batch.table_rows, counts, strict=True))
        pages = list(itertools.chain.from_iterable(runs))
        if len(pages) != total:
            i, r = next((i, r) for i, r in enumerate(batch.table_rows) if len(tables[r]) < counts[i])
            raise _short_table(i, int(pos[i]), counts[i], len(tables[r]))
        st.kv_indices[:total] = pages
    st.rows[0, :n] = batch.token_ids
    st.rows[1, :n] = pos
    # A row's slot is in its last page: the last entry of its run of kv_indices.
    st.rows[2, :n] = st.kv_indices[st.kv_indptr[1 : n + 1] - 1] * ps + pos % ps
    st.rows[3, :n] = batch.sources
    st.kv_last_page_len[:n] = pos % ps + 1
    return total


def stage_capture_rows(st: DecodeStaging, bucket: int) -> int:
    """Inputs for warm-up and capture: every row a one-token sequence on page 0 that writes nothing
    (slot -1). Returns the number of page indices written."""
    st.rows[:, :bucket] = PADDING_ROW
    st.kv_indptr[: bucket + 1] = np.arange(bucket + 1)
    st.kv_last_page_len[:bucket] = 1
    st.kv_indices[:bucket] = 0
    return bucket


class DecodeInputs:
    """Static device inputs of every decode graph, sized for the largest bucket, with pinned host
    mirrors (`staging` holds their numpy views). One device block [5, max_batch] int64: row 0 the
    greedy tokens the last replay wrote, rows 1..4 a step's host token ids, positions, slots and token
    sources, uploaded in one async copy. Rows 0 and 1 together are the token pool a graph gathers its
    input ids from (source r < max_batch: the last replay's token of row r; max_batch + i: the host
    token of row i). The plan inputs (kv_indptr, kv_last_page_len on the host; kv_indices staged on the
    device) need no sync. Greedy tokens come back through a ring of pinned buffers, one per launch that
    may be in flight."""

    RING = 2  # launches in flight at once: one running, one queued behind it

    def __init__(self, max_batch: int, max_pages_per_seq: int, device: torch.device) -> None:
        self.max_batch = max_batch
        self.max_pages_per_seq = max_pages_per_seq
        self.device_buf = torch.zeros(5, max_batch, dtype=torch.int64, device=device)
        self.argmax = self.device_buf[0]
        self.token_pool = self.device_buf[:2].view(-1)
        self.positions, self.slot_mapping, self.sources = self.device_buf[2:].unbind(0)
        # The whole (contiguous, 4 x max_batch) block: a strided slice would be staged through pageable memory.
        self.rows = StagedBuffer((4, max_batch), torch.int64, device, dev=self.device_buf[1:])
        self.kv_indptr = host_tensor((max_batch + 1,), torch.int32, device)
        self.kv_last_page_len = host_tensor((max_batch,), torch.int32, device, fill=1)
        self.kv_indices = StagedBuffer((max_batch * max_pages_per_seq,), torch.int32, device)
        self.staging = DecodeStaging(
            self.rows.np, self.kv_indptr.numpy(), self.kv_last_page_len.numpy(), self.kv_indices.np
        )
        self._host_sources = np.arange(max_batch, 2 * max_batch, dtype=np.int64)
        self.consumed = device_event(device)
        self.consumed.record()
        self.out_host = host_tensor((self.RING, max_batch), torch.int64, device)
        self.out_rows = list(self.out_host.unbind(0))
        self.out_np = [row.numpy() for row in self.out_rows]
        self.out_ready = [device_event(device) for _ in range(self.RING)]
        self.next_out = 0
        # Plan inputs of each batch size, made once (a view per step costs host time).
        self._plan_views = [(self.kv_indptr[: b + 1], self.kv_last_page_len[:b]) for b in range(max_batch + 1)]

    def wait_writable(self) -> DecodeStaging:
        # The previous step's async copies may still be reading the pinned buffers.
        self.consumed.synchronize()
        return self.staging

    def upload(self, bucket: int, num_indices: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Start the copies; returns plan inputs (kv_indptr host, kv_indices device, last_page_len host)."""
        src = self.staging.rows[3, :bucket]
        np.copyto(src, self._host_sources[:bucket], where=src < 0)
        self.rows.upload()
        indices = self.kv_indices.upload(num_indices)
        indptr, last = self._plan_views[bucket]
        return indptr, indices, last

    def mark_consumed(self) -> None:
        self.consumed.record()

    def read_back(self, n: int, seq_no: int) -> PendingDecode:
        """Copy the greedy tokens of the replay just launched to the host, behind it on the stream."""
        slot = self.next_out
        self.next_out = (slot + 1) % self.RING
        self.out_rows[slot].copy_(self.argmax, non_blocking=True)
        self.out_ready[slot].record()
        return PendingDecode(self.out_ready[slot], self.out_np[slot], n, seq_no)


class PendingDecode:
    """The greedy tokens of a launched decode step, readable once the device has produced them."""

    def __init__(self, ready: Event, host: np.ndarray, n: int, seq_no: int) -> None:
        self._ready = ready
        self._host = host
        self.n = n
        self.seq_no = seq_no

    def tokens(self) -> list[int]:
        self._ready.synchronize()
        return self._host[: self.n].tolist()
