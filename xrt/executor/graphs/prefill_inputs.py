"""The prefill graphs' shapes and host staging. Layout of a replay of S sequence slots and T token slots:
the real sequences first, then empty sequences up to S, then one dummy sequence holding the padding tokens
(token 0, slot -1 so nothing is written to the KV cache, position 0 because a bucket may be longer than
the RoPE table); its causal attention over its own q/k/v is well defined and no real row reads it.
qo_indptr therefore has S + 2 entries and always ends at T, the fixed row count of a graph's attention.
Only the last token of each sequence that wants logits goes through lm_head inside the graph (rows
gathered before the projection), then greedy argmax."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xrt.config import ExecutorArgs
from xrt.executor.step import SeqChunk, StepInput
from xrt.ids import int64_array

FIRST_TOKEN_BUCKET = 256


def default_token_buckets(max_tokens: int) -> list[int]:
    """256, 512, 1024, ... doubling below max_tokens, then max_tokens itself."""
    out, size = [], FIRST_TOKEN_BUCKET
    while size < max_tokens:
        out.append(size)
        size *= 2
    return [*out, max_tokens]


def seq_buckets(max_seqs: int) -> list[int]:
    """1, 2, 4, ... doubling below max_seqs, then max_seqs itself."""
    out, size = [], 1
    while size < max_seqs:
        out.append(size)
        size *= 2
    return [*out, max_seqs]


@dataclass(frozen=True)
class PrefillShapes:
    seq_sizes: tuple[int, ...]  # ascending
    token_sizes: tuple[int, ...]  # ascending

    @classmethod
    def from_args(cls, args: ExecutorArgs) -> PrefillShapes:
        tokens = args.prefill_graph_token_buckets or default_token_buckets(args.prefill_graph_max_tokens)
        return cls(tuple(seq_buckets(args.prefill_graph_max_seqs)), tuple(sorted(set(tokens))))

    @property
    def max_seqs(self) -> int:
        return self.seq_sizes[-1]

    @property
    def max_tokens(self) -> int:
        return self.token_sizes[-1]

    def all(self) -> list[tuple[int, int]]:
        """Every (sequences, tokens) shape a graph is captured for, largest first."""
        return [(s, t) for t in reversed(self.token_sizes) for s in reversed(self.seq_sizes)]

    def fit(self, step: StepInput) -> tuple[int, int] | None:
        """The smallest shape holding this step, or None when it must run eager: not a prefill, a
        sequence with KV before this step (cached prefix or earlier chunk), an empty chunk, or too
        many sequences or tokens."""
        if not step.is_prefill or len(step.seqs) > self.max_seqs:
            return None
        num_tokens = 0
        for chunk in step.seqs:
            if chunk.start_pos != 0 or not chunk.token_ids:
                return None
            num_tokens += len(chunk.token_ids)
        if num_tokens > self.max_tokens:
            return None
        seqs = next(s for s in self.seq_sizes if s >= len(step.seqs))
        tokens = next(t for t in self.token_sizes if t >= num_tokens)
        return seqs, tokens


def stage_prefill(
    step: StepInput, seqs: int, tokens: int, page_size: int, flat: np.ndarray, qo_indptr: np.ndarray
) -> int:
    """Write one prefill of fresh prompts padded to (seqs, tokens) into host arrays: flat int64
    [>= 3 * tokens + seqs] = token ids, positions, KV slots (tokens each), then the logits rows
    (seqs: the last token of each sequence wanting logits, in order, then row 0); qo_indptr int32
    [>= seqs + 2]. Returns the number of logits rows."""
    n = len(step.seqs)
    if n > seqs:
        raise ValueError(f"{n} sequences do not fit a prefill graph of {seqs}")
    ids, pos, slots = flat[:tokens], flat[tokens : 2 * tokens], flat[2 * tokens : 3 * tokens]
    rows = flat[3 * tokens : 3 * tokens + seqs]
    qo_indptr[0] = 0
    start = num_rows = 0
    for i, chunk in enumerate(step.seqs):
        length = len(chunk.token_ids)
        num_pages = -(-length // page_size)
        if chunk.start_pos != 0:
            raise ValueError(f"step.seqs[{i}]: a graph prefill starts at position 0, got {chunk.start_pos}")
        if len(chunk.page_table) < num_pages:
            raise ValueError(
                f"step.seqs[{i}]: page_table has {len(chunk.page_table)} pages, {length} tokens need {num_pages}"
            )
        end = start + length
        if end > tokens:
            raise ValueError(f"{step.num_tokens} tokens do not fit a prefill graph of {tokens}")
        pages = np.asarray(chunk.page_table[:num_pages], dtype=np.int64)
        ids[start:end] = int64_array(chunk.token_ids)
        pos[start:end] = np.arange(length)
        slots[start:end] = (pages[:, None] * page_size + np.arange(page_size)).ravel()[:length]
        qo_indptr[i + 1] = end
        if chunk.needs_logits:
            rows[num_rows] = end - 1
            num_rows += 1
        start = end
    ids[start:] = 0
    pos[start:] = 0
    slots[start:] = -1
    rows[num_rows:] = 0
    qo_indptr[n + 1 : seqs + 1] = start
    qo_indptr[seqs + 1] = tokens
    return num_rows


def stage_padding(seqs: int, tokens: int, flat: np.ndarray, qo_indptr: np.ndarray) -> None:
    """Warm-up and capture inputs: one-token sequences in the `seqs` slots (empty ones when there
    are fewer tokens) and the dummy holding the rest, every token padding (slot -1: nothing is written)."""
    ones = min(seqs, tokens)
    flat[: 3 * tokens + seqs] = 0
    flat[2 * tokens : 3 * tokens] = -1
    flat[3 * tokens : 3 * tokens + seqs] = np.minimum(np.arange(seqs), tokens - 1)
    qo_indptr[: ones + 1] = np.arange(ones + 1)
    qo_indptr[ones + 1 : seqs + 1] = ones
    qo_indptr[seqs + 1] = tokens


def padding_step(seqs: int, tokens: int, page_size: int) -> StepInput:
    """A capture layout of (seqs, tokens) as a StepInput: one-token sequences, then one holding the
    rest (every page table points at page 0; the caller turns every slot into -1)."""
    ones = min(seqs, tokens)
    chunks = [SeqChunk([0], 0, [0]) for _ in range(ones)]
    if tokens > ones:
        rest = tokens - ones
        chunks.append(SeqChunk([0] * rest, 0, [0] * -(-rest // page_size), needs_logits=False))
    return StepInput(is_prefill=True, seqs=chunks)
