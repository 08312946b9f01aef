"""Reference attention backend: the `xrt::paged_attention` op over the paged cache. Works on any
device; the executor uses it on CPU, and on CUDA when FlashInfer is unavailable.

Its graph hooks keep the CSR a graph's attention reads in static buffers, as FlashInfer's do, so the graph
managers run on CPU over it (tests: a "graph" that re-runs its function on replay reads what was staged
last). It reads the CSR back to the host (`tolist`), so a real CUDA graph cannot capture it."""

from __future__ import annotations

import torch
from torch import Tensor

import xrt.ops  # noqa: F401  (declares torch.ops.xrt.paged_attention)
from xrt.attention.graph_buffers import GraphDecodeBuffers
from xrt.attention.metadata import AttentionMetadata
from xrt.kernels.qk_norm_rope_args import QKNormRope


class TorchRefBackend:
    """graph_requirement: what CUDA graphs need that the runner could not give (on CUDA, why FlashInfer
    was not used); None: graphs may be taken (on CPU)."""

    def __init__(self, device: torch.device | str = "cpu", graph_requirement: str | None = None) -> None:
        self.device = torch.device(device)
        self._graph_requirement = graph_requirement
        # (qo_indptr, kv_indptr, kv_indices, kv_last_page_len) the next forward reads.
        self._csr: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        # qo_indptr of a prefill graph: attend over this step's k/v instead of the cache.
        self._ragged_qo: Tensor | None = None
        self._decode: GraphDecodeBuffers | None = None
        self._rows = torch.zeros(0, dtype=torch.int32)
        self._prefill_qo = torch.zeros(0, dtype=torch.int32)

    def plan(self, meta: AttentionMetadata) -> None:
        self._csr = (meta.qo_indptr, meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len)
        self._ragged_qo = None

    def forward(self, q: Tensor, kv_cache: Tensor, layer_idx: int, scale: float, k: Tensor | None = None,
                v: Tensor | None = None, pdl: bool | None = None) -> Tensor:
        """Reads the paged cache (k and v are ignored), except in a prefill graph. No PDL here."""
        if self._ragged_qo is not None:
            if k is None or v is None:
                raise ValueError("a prefill graph attends over this step's k and v (forward(..., k=, v=))")
            # Causal attention of each sequence over its own k/v: paged attention with one-token pages.
            qo, t = self._ragged_qo, q.shape[0]
            pages = torch.arange(t, dtype=torch.int32, device=q.device)
            ones = torch.ones(qo.numel() - 1, dtype=torch.int32, device=q.device)
            return torch.ops.xrt.paged_attention(q, torch.stack((k, v), dim=1).unsqueeze(2), qo, qo, pages, ones, scale)
        if self._csr is None:
            raise RuntimeError("TorchRefBackend.forward called before plan()")
        return torch.ops.xrt.paged_attention(q, kv_cache, *self._csr, scale)

    def fuses_qk_norm_rope(self) -> bool:
        return False

    def forward_fused(self, qkv: Tensor, rope: QKNormRope, kv_cache: Tensor, layer_idx: int, scale: float,
                      pdl: bool | None = None) -> Tensor:
        raise RuntimeError("TorchRefBackend.forward_fused: the reference backend never fuses the q/k norm and RoPE "
                           "(fuses_qk_norm_rope() is False)")

    # -- graph hooks ------------------------------------------------------------------------------

    def graph_requirement(self) -> str | None:
        return self._graph_requirement

    def init_decode_graphs(self, batch_sizes: list[int], max_pages_per_seq: int) -> GraphDecodeBuffers:
        self._decode = GraphDecodeBuffers(max(batch_sizes), max_pages_per_seq, self.device)
        self._rows = torch.arange(max(batch_sizes) + 1, dtype=torch.int32, device=self.device)
        return self._decode

    def prepare_decode_graph(self, kv_indptr_host: Tensor, kv_indices: Tensor, kv_last_page_len_host: Tensor) -> None:
        bufs, batch = self._decode, kv_last_page_len_host.numel()
        if bufs is None:
            raise RuntimeError("prepare_decode_graph before init_decode_graphs")
        bufs.load(kv_indptr_host, kv_indices, kv_last_page_len_host)
        self._csr = (self._rows[: batch + 1], *bufs.csr(batch))
        self._ragged_qo = None

    def init_prefill_graphs(self, shapes: list[tuple[int, int]]) -> Tensor:
        self._prefill_qo = torch.zeros(max(e for e, _ in shapes) + 1, dtype=torch.int32, device=self.device)
        return self._prefill_qo

    def prepare_prefill_graph(self, qo_indptr_host: Tensor) -> None:
        qo = self._prefill_qo[: qo_indptr_host.numel()]
        qo.copy_(qo_indptr_host, non_blocking=True)
        self._ragged_qo = qo

    def prefill_graph_bytes(self, max_entries: int) -> int:
        return 4 * (max_entries + 1)
