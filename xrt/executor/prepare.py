"""Turn a StepInput (plain Python) into the token tensor and the attention metadata of one eager step.
(The graphs stage their steps into static buffers instead: `xrt.executor.graphs`.)"""

from __future__ import annotations

import numpy as np
import torch

from xrt.attention.metadata import AttentionMetadata, HostCSR
from xrt.executor.step import StepInput
from xrt.ids import int64_array


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
    int64s = [int64_array(token_ids), *_cat(positions), *_cat(slots),
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
        logits_indices=logit_rows,
        has_prefix=any(chunk.start_pos > 0 for chunk in step.seqs),
        page_size=page_size,
        host=HostCSR(qo_h, kv_h, idx_h, last_h, lens_h),
    )
    return ids, meta


def _cat(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.concatenate(parts)] if parts else []
