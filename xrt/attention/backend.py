"""The interface every attention backend implements. The executor picks one (`xrt.attention.select`: the
torch reference on CPU, FlashInfer on CUDA) and puts it in the forward context; layers call it without
knowing which it is. A backend also carries its own CUDA-graph hooks, so the graph managers
(`xrt.executor.graphs`) capture and replay any backend the same way and never ask which one they hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from xrt.attention.graph_buffers import GraphDecodeBuffers
from xrt.attention.metadata import AttentionMetadata
from xrt.kernels.qk_norm_rope_args import QKNormRope


@dataclass(frozen=True)
class AttentionShape:
    """The attention a backend serves: heads, the paged cache's page size, activation dtype and device."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    device: torch.device


class AttentionBackend(Protocol):
    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare for one eager step (FlashInfer plans from meta.host). Called once per step, before the
        forward pass and outside any CUDA graph capture."""

    def forward(self, q: Tensor, kv_cache: Tensor, layer_idx: int, scale: float, k: Tensor | None = None,
                v: Tensor | None = None, pdl: bool | None = None) -> Tensor:
        """q: [num_tokens, num_heads, head_dim]; kv_cache: this layer's paged cache, already holding this
        step's K/V. Returns [num_tokens, num_heads, head_dim], causal over each sequence's full KV.
        k, v: this step's keys and values [num_tokens, num_kv_heads, head_dim] (the same values the cache
        received, possibly strided views); a backend may attend over them instead of the cache when no
        sequence has KV from an earlier step, and is free to ignore them. pdl: whether xrt's own Triton
        attention kernel may take part in programmatic dependent launch, as the layer decides
        (`xrt.layers.options.uses_pdl`; None: the kernel's default); ignored by backends without one."""

    def fuses_qk_norm_rope(self) -> bool:
        """Whether the attention planned for this step (or the decode graph prepared) does the layer's q/k norm,
        RoPE and KV write itself: the layer then hands `forward_fused` its raw qkv instead of running
        xrt::qk_norm_rope_store_kv and `forward`. Fixed from plan / prepare until the next, so a captured graph
        and its replays take the same path."""

    def forward_fused(self, qkv: Tensor, rope: QKNormRope, kv_cache: Tensor, layer_idx: int, scale: float,
                      pdl: bool | None = None) -> Tensor:
        """Where `fuses_qk_norm_rope()`: qkv [num_tokens, (H + 2 KV) * D] as the projection left it (not written);
        q and k normalised and rotated, this step's k and v written to kv_cache at rope.slot_mapping, then attention
        as `forward`. Returns [num_tokens, num_heads, head_dim]."""

    # -- CUDA graphs. Capture and replay are prepared alike: the graph manager stages a capture's
    # dummy step like any other (every row well-formed), and the backend prepares it as it prepares a
    # replay (FlashInfer: plan outside the graph, on the replaying stream, from host CSR).

    def graph_requirement(self) -> str | None:
        """None when graphs may be taken of this backend's attention, else what they need that it lacks,
        read after "cudagraph needs" (e.g. "FlashInfer attention (flashinfer-python is not installed)")."""

    def init_decode_graphs(self, batch_sizes: list[int], max_pages_per_seq: int) -> GraphDecodeBuffers:
        """Set up decode graphs of these batch sizes (padding rows included); returns the static device CSR
        the captured attention reads (a batch of b rows: kv_indptr[:b + 1], kv_indices, kv_last_page_len[:b])."""

    def prepare_decode_graph(self, kv_indptr_host: Tensor, kv_indices: Tensor, kv_last_page_len_host: Tensor) -> None:
        """Before capturing or replaying the decode graph of len(kv_last_page_len_host) rows: copy this step's
        CSR (host indptr and last-page lengths, device page indices) into the static buffers and plan."""

    def init_prefill_graphs(self, shapes: list[tuple[int, int]]) -> Tensor:
        """Set up prefill graphs of (entries, tokens): `entries` sequences (padding included) whose ragged
        attention covers exactly `tokens` rows, each over its own k/v. Returns the static device qo_indptr
        the captured attention reads (entries + 1 leading elements)."""

    def prepare_prefill_graph(self, qo_indptr_host: Tensor) -> None:
        """Before capturing or replaying the prefill graph of len(qo_indptr_host) - 1 entries and
        qo_indptr_host[-1] tokens: copy qo_indptr into the static buffer and plan."""

    def prefill_graph_bytes(self, max_entries: int) -> int:
        """Device memory init_prefill_graphs allocates for graphs of up to `max_entries` entries (the KV
        cache is sized before the graphs exist)."""
