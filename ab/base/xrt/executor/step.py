"""What the engine hands the executor each step: plain Python, no tensors. The executor turns it
into device tensors and attention metadata (`xrt.executor.prepare`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's share of a step.

    token_ids: the new tokens computed this step (a prefill chunk, or the one decode token).
    start_pos: tokens of this sequence already in the KV cache (cached prefix + earlier chunks);
        the new tokens take positions start_pos .. start_pos + len(token_ids) - 1.
    page_table: KV pages of this sequence, in order, covering at least start_pos + len(token_ids).
    needs_logits: whether the last new token's logits are wanted (final prefill chunk, or decode).
    """

    token_ids: list[int]
    start_pos: int
    page_table: list[int]
    needs_logits: bool = True


@dataclass(frozen=True)
class StepInput:
    """A batch for one forward pass. is_prefill: every chunk may carry several tokens;
    otherwise every chunk carries exactly one token (a decode step)."""

    is_prefill: bool
    seqs: list[SeqChunk]

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)


def as_decode(step: StepInput) -> StepInput:
    """A prefill step whose every chunk is one token with logits (a prompt whose prefix came whole from the KV
    cache or a tier leaves exactly its last token to compute) is a decode step in all but name: the same as a
    decode step, so it takes the decode kernels and graphs (on the H200 at 8k cached tokens of Qwen3-8B, paged
    prefill attention costs 122 us a layer for that one row, and the eager step is host-bound at ~20 ms)."""
    if step.is_prefill and step.seqs and all(len(c.token_ids) == 1 and c.needs_logits for c in step.seqs):
        return StepInput(False, step.seqs)
    return step


@dataclass(slots=True)  # not frozen: made every decode step, and a frozen dataclass costs ~1.5 us to build
class DecodeBatch:
    """A greedy decode step the engine asks a runner to launch itself (`Runner.launch_decode`), described
    by per-row arrays instead of SeqChunks, so staging needs no Python loop over pages.

    token_ids: the token each row feeds (ignored where sources[i] >= 0).
    sources: -1 feeds token_ids[i]; r >= 0 feeds the greedy token of row r of the previous launch, which
        is still on the device (the host has not read it).
    positions: the position each row's token takes (its sequence's KV length before this step).
    table_rows: each row's row in `page_tables` ([rows, pages] int32: a sequence's pages in order, the
        KV cache's page-table array, `xrt.kvcache`; or one page list per row, a StepInput's page tables).
    """

    token_ids: Sequence[int]
    sources: Sequence[int]
    positions: Sequence[int]
    table_rows: Sequence[int]
    page_tables: np.ndarray | Sequence[Sequence[int]]

    def __len__(self) -> int:
        return len(self.positions)
