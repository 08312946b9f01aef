"""Per-step attention metadata, built once by the executor and shared by every layer.

Paged KV layout (FlashInfer "NHD"): one tensor per layer of shape
`[num_pages, 2, page_size, num_kv_heads, head_dim]` (index 0 = K, 1 = V).
A token's slot is `page * page_size + offset`; slot < 0 means "do not write" (padding rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class HostCSR:
    """CPU copies of a step's CSR, int32, for backends that plan on the host (FlashInfer)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    seq_lens: torch.Tensor


@dataclass
class AttentionMetadata:
    is_prefill: bool
    num_seqs: int
    num_tokens: int
    positions: torch.Tensor  # [num_tokens] int64, device
    slot_mapping: torch.Tensor  # [num_tokens] int64, device
    # CSR over sequences, FlashInfer conventions; int32, on the device.
    qo_indptr: torch.Tensor  # [num_seqs + 1] new tokens per sequence
    kv_indptr: torch.Tensor  # [num_seqs + 1] pages per sequence
    kv_indices: torch.Tensor  # [kv_indptr[-1]] page ids
    kv_last_page_len: torch.Tensor  # [num_seqs] tokens in each sequence's last page (1..page_size)
    seq_lens: torch.Tensor  # [num_seqs] total KV length after this step (prefix + new)
    logits_indices: torch.Tensor  # [num_logit_rows] int64: rows of the hidden states to project
    has_prefix: bool  # some sequence has KV before its first new token (cached prefix / earlier chunk)
    page_size: int
    # The same CSR on the host for plan(); None in a CUDA graph's metadata, whose attention the graph
    # manager prepares from its own staged inputs (AttentionBackend.prepare_decode_graph and the like).
    host: HostCSR | None = None
