"""What the engine hands the executor each step: plain Python, no tensors. The executor turns it
into device tensors and attention metadata (`xrt.executor.prepare`)."""

from __future__ import annotations

from dataclasses import dataclass


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
