"""What the step channel carries: a message kind and a flat int64 payload (no pickle). A `StepInput` or a
`DecodeBatch` becomes one numpy array here and is rebuilt from it on the other ranks.

STEP:   [is_prefill, n, start_pos * n, needs_logits * n, num_tokens * n, num_pages * n, tokens..., pages...]
LAUNCH: [has_after, n, width, token_ids * n, sources * n, positions * n, page rows (n x width)...]
        (only the pages each row reads: the rows of the batch's page tables, `width` = the most pages a row
        needs, so the KV cache manager's whole table never travels).
KV_*:   kv_wire.py."""

from __future__ import annotations

import enum
import itertools

import numpy as np

from xrt.executor.step import DecodeBatch, SeqChunk, StepInput


class Kind(enum.IntEnum):
    KEEPALIVE = 0  # rank 0 is idle but alive: the workers' wait starts again
    STEP = 1  # Runner.execute(StepInput)
    LAUNCH = 2  # Runner.launch_decode(DecodeBatch, after)
    SHUTDOWN = 3  # the run is over: the workers leave their loop
    # KV tiers (kv_wire.py): rank 0's tier operations, mirrored on each rank's own shard (xrt/kvstore/shard.py)
    KV_STORE = 4  # gather these chunks' pages into L1 (and L2)
    KV_LOOKUP = 5  # how many leading chunks are held: then one all_reduce(MIN)
    KV_LOAD = 6  # load chunks into pages: then one all_reduce(MIN) of the leading chunks loaded
    KV_FLUSH = 7  # finish the L2 writes queued: then one all_reduce (a barrier) and one of the ranks' counters
    KV_PREFETCH = 8  # a queued request's prefix chunks: read those this rank's L2 holds into its L1 (no collective)


def encode_step(step: StepInput) -> np.ndarray:
    seqs = step.seqs
    n = len(seqs)
    meta = np.empty((4, n), dtype=np.int64)
    meta[0] = [c.start_pos for c in seqs]
    meta[1] = [c.needs_logits for c in seqs]
    meta[2] = [len(c.token_ids) for c in seqs]
    meta[3] = [len(c.page_table) for c in seqs]
    tokens = np.fromiter(itertools.chain.from_iterable(c.token_ids for c in seqs), np.int64, int(meta[2].sum()))
    pages = np.fromiter(itertools.chain.from_iterable(c.page_table for c in seqs), np.int64, int(meta[3].sum()))
    return np.concatenate((np.array([int(step.is_prefill), n], dtype=np.int64), meta.ravel(), tokens, pages))


def decode_step(p: np.ndarray) -> StepInput:
    is_prefill, n = bool(p[0]), int(p[1])
    meta = p[2 : 2 + 4 * n].reshape(4, n).tolist()
    starts, logits, lens, num_pages = meta
    at = 2 + 4 * n
    tokens = p[at : at + sum(lens)].tolist()
    pages = p[at + sum(lens) : at + sum(lens) + sum(num_pages)].tolist()
    seqs, t, q = [], 0, 0
    for start, wants, k, m in zip(starts, logits, lens, num_pages, strict=True):
        seqs.append(SeqChunk(tokens[t : t + k], start, pages[q : q + m], bool(wants)))
        t, q = t + k, q + m
    return StepInput(is_prefill, seqs)


def encode_launch(batch: DecodeBatch, has_after: bool, page_size: int) -> np.ndarray:
    n = len(batch)
    width = max(batch.positions) // page_size + 1 if n else 0
    tables = batch.page_tables
    if isinstance(tables, np.ndarray):
        rows = tables[np.asarray(batch.table_rows, dtype=np.int64), :width]
    else:
        rows = np.zeros((n, width), dtype=np.int64)
        for i, r in enumerate(batch.table_rows):
            row = list(tables[r][:width])
            rows[i, : len(row)] = row
    width = rows.shape[1]
    head = np.array([int(has_after), n, width], dtype=np.int64)
    cols = np.array([batch.token_ids, batch.sources, batch.positions], dtype=np.int64).reshape(3 * n)
    return np.concatenate((head, cols, rows.reshape(-1).astype(np.int64, copy=False)))


def decode_launch(p: np.ndarray) -> tuple[DecodeBatch, bool]:
    has_after, n, width = bool(p[0]), int(p[1]), int(p[2])
    token_ids, sources, positions = p[3 : 3 + 3 * n].reshape(3, n).tolist()
    tables = p[3 + 3 * n : 3 + 3 * n + n * width].reshape(n, width).astype(np.int32)
    return DecodeBatch(token_ids, sources, positions, range(n), tables), has_after
