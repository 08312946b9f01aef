"""Static device buffers a captured graph's attention reads, shared by the backends' graph hooks."""

from __future__ import annotations

import torch


class GraphDecodeBuffers:
    """The decode graphs' CSR: one set sized for the largest batch, each batch size reads leading slices
    (only one graph replays at a time)."""

    def __init__(self, max_batch: int, max_pages_per_seq: int, device: torch.device) -> None:
        self.kv_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_batch * max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_batch, dtype=torch.int32, device=device)

    def load(self, kv_indptr_host: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len_host: torch.Tensor) -> None:
        """Copy one step's CSR in (asynchronously from pinned host memory on CUDA)."""
        batch = kv_last_page_len_host.numel()
        self.kv_indptr[: batch + 1].copy_(kv_indptr_host, non_blocking=True)
        self.kv_last_page_len[:batch].copy_(kv_last_page_len_host, non_blocking=True)
        self.kv_indices[: kv_indices.numel()].copy_(kv_indices, non_blocking=True)

    def csr(self, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv_indptr, kv_indices, kv_last_page_len) of a batch of `batch` rows."""
        return self.kv_indptr[: batch + 1], self.kv_indices, self.kv_last_page_len[:batch]
