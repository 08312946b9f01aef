"""FlashInfer (0.6.14) attention over the paged KV cache: decode, paged prefill (a sequence with a cached
prefix or an earlier chunk), ragged prefill (no sequence has KV before this step: attention reads this
step's k/v straight from the packed qkv instead of gathering them back from the pages), and fixed-layout
decode and ragged-prefill wrappers for CUDA-graph replay. flashinfer is imported when a backend is built,
never at module import, so this file imports on CPU."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import torch

from xrt.attention.backend import AttentionShape
from xrt.attention.graph_buffers import GraphDecodeBuffers
from xrt.attention.metadata import AttentionMetadata
from xrt.kernels.qk_norm_rope_args import QKNormRope

KV_LAYOUT = "NHD"
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
# FlashInfer's decode/prefill kernels are instantiated for these head sizes.
SUPPORTED_HEAD_DIMS = (64, 128, 256)
# Integer workspace shared by the CUDA-graph prefill wrappers (FlashInfer gives each wrapper 8 MiB). Their
# plans need (tokens / 128 + sequences) * heads * 28 bytes at most: about 130 KiB at 8192 tokens and 64 heads.
GRAPH_PREFILL_INT_WORKSPACE = 2 << 20
# Decode batches this small use xrt's split-KV Triton kernel (xrt.kernels.decode_attention) instead of
# FlashInfer: at batches 1-2 it is faster per layer (bench/results/h200-ee4b1de/decode_attention.md), and at 3-8
# it also takes the layer's q/k norm, RoPE and KV write (one launch a layer fewer), which made whole steps
# faster (bench/NOTES.md). Batches up to SMALL_DECODE_FIXED_BATCH cut a sequence into fixed 64-token chunks, so
# a row's result is the same at either; larger ones take fewer, longer chunks (DecodeAttention.splits_for), by
# the batch rounded up to a power of two: eager and CUDA-graph decode then take the same kernel and the same
# chunks for a batch as long as the graph buckets up to 8 are powers of two (the default buckets are).
SMALL_DECODE_MAX_BATCH = 8
SMALL_DECODE_FIXED_BATCH = 2
SMALL_DECODE_SPLIT_TOKENS = 64
# Its grid has one program per 64-token chunk of the longest possible sequence; beyond this many the empty
# programs would cost more than the kernel saves.
SMALL_DECODE_MAX_SPLITS = 64


class FlashInferUnavailable(ImportError):
    """FlashInfer cannot serve this model here; the runner falls back to the torch reference."""


def unsupported_reason(dtype: torch.dtype, head_dim: int) -> str | None:
    """Why FlashInfer cannot serve this dtype and head size here, or None when it can."""
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer-python is not installed"
    if dtype not in SUPPORTED_DTYPES:
        return f"FlashInfer attention needs bfloat16 or float16, got {str(dtype).removeprefix('torch.')}"
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"FlashInfer attention needs head_dim in {SUPPORTED_HEAD_DIMS}, got {head_dim}"
    return None


def check_prefill_kernel(kernel: str, capability: tuple[int, int]) -> None:
    """executor.prefill_attention against the device: FlashInfer's fa3 kernels exist for sm_90+ only, and would
    otherwise fail at the first prefill, deep in FlashInfer."""
    if kernel == "fa3" and capability[0] < 9:
        raise ValueError(
            f"executor.prefill_attention: fa3 needs a Hopper or newer GPU (sm_90+), this one is "
            f"sm_{capability[0]}{capability[1]}; use auto or fa2"
        )


def use_tensor_cores(num_heads: int, num_kv_heads: int) -> bool:
    # Same rule as sglang: the tensor-core (prefill-kernel) decode pays off from GQA groups of 4.
    return num_heads // num_kv_heads >= 4


class GraphPrefillBuffers:
    """Device buffers of the CUDA-graph ragged-prefill wrappers: qo/kv indptr sized for the most
    sequences (each wrapper takes leading slices) and one integer workspace, all shared (only one
    graph is planned and replayed at a time)."""

    def __init__(self, max_entries: int, device: torch.device) -> None:
        self.qo_indptr = torch.zeros(max_entries + 1, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_entries + 1, dtype=torch.int32, device=device)
        self.int_workspace = torch.zeros(GRAPH_PREFILL_INT_WORKSPACE, dtype=torch.uint8, device=device)


class FlashInferBackend:
    """plan(meta) once per step from meta.host, then forward(q, kv_cache, layer_idx, scale)
    per layer. All wrappers share one float workspace (they never run concurrently)."""

    def __init__(
        self,
        shape: AttentionShape,
        workspace_mb: int,
        kv_dtype: torch.dtype | None = None,
        ragged_prefill: bool = False,
        max_pages_per_seq: int = 0,
        fuse_qk_norm_rope: bool = False,
        prefill_kernel: str = "auto",
    ) -> None:
        """fuse_qk_norm_rope: the small-batch Triton decode does the layers' q/k norm, RoPE and KV write itself
        (executor.fuse_qk_norm_rope; `fuses_qk_norm_rope`). prefill_kernel: FlashInfer's backend of the ragged
        prefill wrappers, eager and graph (executor.prefill_attention: auto, fa2, fa3)."""
        dtype, head_dim = shape.dtype, shape.head_dim
        reason = unsupported_reason(dtype, head_dim) or unsupported_reason(kv_dtype or dtype, head_dim)
        if reason:
            raise FlashInferUnavailable(reason)
        if torch.device(shape.device).type != "cuda":
            raise ValueError(f"FlashInfer attention needs a CUDA device, got {shape.device}")
        import flashinfer

        self._fi = flashinfer
        self.shape = shape
        # (heads, kv heads, head_dim): every plan passes them.
        self._heads = (shape.num_heads, shape.num_kv_heads, head_dim)
        self.page_size = shape.page_size
        self.dtype = dtype
        self.kv_dtype = kv_dtype or dtype
        self.device = torch.device(shape.device)
        self.scale = 1.0 / math.sqrt(head_dim)
        self.ragged_prefill = ragged_prefill
        self.prefill_kernel = prefill_kernel
        # Programmatic dependent launch (Hopper+), decided once: FlashInfer would query the device on every run.
        capability = torch.cuda.get_device_capability(self.device)
        self.enable_pdl = capability[0] >= 9
        check_prefill_kernel(prefill_kernel, capability)
        self.tensor_cores = use_tensor_cores(shape.num_heads, shape.num_kv_heads)
        # Zeroed: FlashInfer requires the float workspace be zero-initialised before its first use.
        self.workspace = torch.zeros(workspace_mb << 20, dtype=torch.uint8, device=self.device)
        fi = self._fi
        self._decode = fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, KV_LAYOUT, use_tensor_cores=self.tensor_cores
        )
        self._paged_prefill = fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, KV_LAYOUT)
        self._ragged_prefill = (
            fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, KV_LAYOUT, backend=prefill_kernel)
            if ragged_prefill else None
        )
        self._graph_decode: dict[int, Any] = {}
        self._graph_decode_buffers: GraphDecodeBuffers | None = None
        self._graph_prefill: dict[tuple[int, int], Any] = {}
        self._graph_prefill_buffers: GraphPrefillBuffers | None = None
        # (wrapper key, qo_indptr) of the last CUDA-graph prefill plan: the wrappers share one integer
        # workspace, so a plan stays valid only until another of them plans.
        self._graph_prefill_plan: tuple[tuple[int, int], torch.Tensor] | None = None
        self._active: Any = None
        self._active_kind = ""
        # qo_indptr of the ragged wrapper's current plan: a ragged plan depends on nothing else, so a step
        # with the same sequence lengths (a benchmark's repeated prefill) reuses it.
        self._ragged_plan_qo: torch.Tensor | None = None
        self.plans = 0  # plan() calls that reached FlashInfer (tests count them)
        self.small_decode = self._make_small_decode(max_pages_per_seq)
        self.fuse_qk_norm_rope = fuse_qk_norm_rope
        self._small_meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def _make_small_decode(self, max_pages_per_seq: int) -> Any:
        """The Triton decode kernel for batches <= SMALL_DECODE_MAX_BATCH, or None where it does not apply
        (unknown or too long a context, a KV dtype other than the activations')."""
        splits = -(-max_pages_per_seq * self.page_size // SMALL_DECODE_SPLIT_TOKENS)
        if not 0 < splits <= SMALL_DECODE_MAX_SPLITS or self.kv_dtype != self.dtype:
            return None
        from xrt.kernels.decode_attention import DecodeAttention

        return DecodeAttention(
            SMALL_DECODE_MAX_BATCH, *self._heads, self.page_size, max_pages_per_seq, self.device,
            SMALL_DECODE_SPLIT_TOKENS, max_splits=splits, fixed_max_batch=SMALL_DECODE_FIXED_BATCH,
        )

    def _uses_small_decode(self, batch: int) -> bool:
        return self.small_decode is not None and batch <= SMALL_DECODE_MAX_BATCH

    # -- planning ---------------------------------------------------------------------------------

    def _dtypes(self, kv_dtype: torch.dtype | None = None) -> dict[str, Any]:
        return {"q_data_type": self.dtype, "kv_data_type": kv_dtype or self.kv_dtype, "sm_scale": self.scale}

    def plan(self, meta: AttentionMetadata) -> None:
        if meta.page_size != self.page_size:
            raise ValueError(f"metadata page_size {meta.page_size} != backend page_size {self.page_size}")
        h, kv, d = self._heads
        host = meta.host
        if host is None:
            raise ValueError("FlashInferBackend.plan: metadata without its host CSR (a CUDA graph's is prepared "
                             "through prepare_decode_graph / prepare_prefill_graph)")
        if not meta.is_prefill and self._uses_small_decode(meta.num_seqs):
            self._small_meta = (meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len)
            self._set_active(self.small_decode, "small_decode")
        elif not meta.is_prefill:
            self._decode.plan(
                host.kv_indptr, meta.kv_indices, host.kv_last_page_len, h, kv, d, self.page_size,
                **self._dtypes(),
            )
            self.plans += 1
            self._set_active(self._decode, "paged")
        elif self._ragged_prefill is not None and not meta.has_prefix:
            # No cached prefix: each sequence's KV is exactly this step's k/v, CSR as the queries. They come
            # from qkv in the activation dtype, whatever the cache's dtype.
            qo = host.qo_indptr
            if self._ragged_plan_qo is None or not torch.equal(self._ragged_plan_qo, qo):
                self._ragged_prefill.plan(qo, qo, h, kv, d, causal=True, **self._dtypes(self.dtype))
                self._ragged_plan_qo = qo.clone()
                self.plans += 1
            self._set_active(self._ragged_prefill, "ragged")
        else:
            self._paged_prefill.plan(
                host.qo_indptr, host.kv_indptr, meta.kv_indices, host.kv_last_page_len,
                h, kv, d, self.page_size, causal=True, **self._dtypes(),
            )
            self.plans += 1
            self._set_active(self._paged_prefill, "paged_prefill")

    def _set_active(self, wrapper: Any, kind: str) -> None:
        self._active = wrapper
        self._active_kind = kind

    # -- graph hooks: CUDA-graph decode ----------------------------------------------------------

    def graph_requirement(self) -> str | None:
        return None

    def init_decode_graphs(self, batch_sizes: list[int], max_pages_per_seq: int) -> GraphDecodeBuffers:
        """Build one fixed-batch decode wrapper per bucket over shared static buffers."""
        bufs = GraphDecodeBuffers(max(batch_sizes), max_pages_per_seq, self.device)
        self._graph_decode_buffers = bufs
        self._graph_decode = {
            b: self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                KV_LAYOUT,
                use_cuda_graph=True,
                use_tensor_cores=self.tensor_cores,
                paged_kv_indptr_buffer=bufs.kv_indptr[: b + 1],
                paged_kv_indices_buffer=bufs.kv_indices,
                paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:b],
            )
            for b in batch_sizes
        }
        return bufs

    def prepare_decode_graph(
        self, kv_indptr_host: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len_host: torch.Tensor
    ) -> None:
        """Plan the bucket wrapper of len(kv_last_page_len_host) sequences (padding rows included);
        must run outside graph capture, on the stream that replays. Copies the page table into the
        static buffers the captured kernels read."""
        batch = kv_last_page_len_host.numel()
        bufs = self._graph_decode_buffers
        if self._uses_small_decode(batch) and bufs is not None:
            # No FlashInfer plan: the kernel reads the page table straight from the static buffers.
            bufs.load(kv_indptr_host, kv_indices, kv_last_page_len_host)
            self._small_meta = bufs.csr(batch)
            self._set_active(self.small_decode, "small_decode")
            return
        wrapper = self._graph_decode.get(batch)
        if wrapper is None:
            raise ValueError(f"no CUDA-graph decode wrapper for batch {batch}; buckets: {sorted(self._graph_decode)}")
        wrapper.plan(
            kv_indptr_host, kv_indices, kv_last_page_len_host, *self._heads, self.page_size, **self._dtypes()
        )
        self.plans += 1
        self._set_active(wrapper, "paged")

    # -- graph hooks: CUDA-graph ragged prefill --------------------------------------------------

    def init_prefill_graphs(self, shapes: list[tuple[int, int]]) -> torch.Tensor:
        """One fixed-shape ragged-prefill wrapper per (entries, tokens): `entries` sequences (padding
        included) whose qo_indptr always ends at `tokens`, over shared static buffers."""
        bufs = GraphPrefillBuffers(max(e for e, _ in shapes), self.device)
        self._graph_prefill = {}
        for entries, tokens in shapes:
            wrapper = self._fi.BatchPrefillWithRaggedKVCacheWrapper(
                self.workspace,
                KV_LAYOUT,
                use_cuda_graph=True,
                qo_indptr_buf=bufs.qo_indptr[: entries + 1],
                kv_indptr_buf=bufs.kv_indptr[: entries + 1],
                backend=self.prefill_kernel,
            )
            wrapper.reset_workspace_buffer(self.workspace, bufs.int_workspace)
            self._graph_prefill[(entries, tokens)] = wrapper
        self._graph_prefill_buffers = bufs
        self._graph_prefill_plan = None
        return bufs.qo_indptr

    def prepare_prefill_graph(self, qo_indptr_host: torch.Tensor) -> None:
        """Plan the wrapper of len(qo_indptr_host) - 1 entries and qo_indptr_host[-1] tokens; each
        sequence attends causally over its own k/v. Must run outside graph capture, on the stream
        that replays; copies qo_indptr into the static buffers the captured kernels read."""
        key = (qo_indptr_host.numel() - 1, int(qo_indptr_host[-1]))
        wrapper = self._graph_prefill.get(key)
        if wrapper is None:
            raise ValueError(
                f"no CUDA-graph prefill wrapper for {key[0]} sequences and {key[1]} tokens; "
                f"shapes: {sorted(self._graph_prefill)}"
            )
        last = self._graph_prefill_plan
        if last is None or last[0] != key or not torch.equal(last[1], qo_indptr_host):
            h, kv, d = self._heads
            try:
                # The first plan of a CUDA-graph wrapper fixes its row count: always `tokens` rows here.
                wrapper.plan(qo_indptr_host, qo_indptr_host, h, kv, d, causal=True, **self._dtypes(self.dtype))
            except Exception as e:
                # FlashInfer's planner reports a short workspace as "Buffer overflow when allocating ...".
                if not any(word in str(e).lower() for word in ("workspace", "overflow")):
                    raise
                raise ValueError(
                    f"executor.workspace_mb: {self.workspace.numel() >> 20} MiB is too small for a CUDA-graph "
                    f"prefill of {key[1]} tokens ({e}); raise it or lower executor.prefill_graph_max_tokens"
                ) from e
            self._graph_prefill_plan = (key, qo_indptr_host.clone())
            self.plans += 1
        self._set_active(wrapper, "ragged")

    def prefill_graph_bytes(self, max_entries: int) -> int:
        """GraphPrefillBuffers: qo and kv indptr, and the integer workspace."""
        return 2 * 4 * (max_entries + 1) + GRAPH_PREFILL_INT_WORKSPACE

    # -- forward ----------------------------------------------------------------------------------

    def fuses_qk_norm_rope(self) -> bool:
        return self.fuse_qk_norm_rope and self._active_kind == "small_decode"

    def forward_fused(self, qkv: torch.Tensor, rope: QKNormRope, kv_cache: torch.Tensor, layer_idx: int, scale: float,
                      pdl: bool | None = None) -> torch.Tensor:
        if not self.fuses_qk_norm_rope():
            raise RuntimeError(f"FlashInferBackend.forward_fused: this step's attention ({self._active_kind or 'none'}"
                               f") does not fuse the q/k norm and RoPE (fuse_qk_norm_rope={self.fuse_qk_norm_rope})")
        self._check_scale(scale)
        assert self._small_meta is not None
        h, kv, d = self._heads
        return self.small_decode.run(qkv.view(qkv.shape[0], h + 2 * kv, d), kv_cache, *self._small_meta, scale,
                                     pdl=pdl, rope=rope)

    def _check_scale(self, scale: float) -> None:
        if scale != self.scale and not math.isclose(scale, self.scale, rel_tol=1e-6):
            # The softmax scale is fixed at plan time (it is baked into CUDA graphs too).
            raise ValueError(f"FlashInfer backend planned with scale {self.scale}, layer asked for {scale}")

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_idx: int, scale: float,
                k: torch.Tensor | None = None, v: torch.Tensor | None = None, pdl: bool | None = None) -> torch.Tensor:
        """pdl: the small-batch Triton decode's (FlashInfer's own kernels use PDL on Hopper+ whatever it says)."""
        kind = self._active_kind
        if not kind:
            raise RuntimeError("FlashInferBackend.forward called before plan()")
        self._check_scale(scale)
        if kind == "small_decode":
            assert self._small_meta is not None
            return self._active.run(q, kv_cache, *self._small_meta, scale, pdl=pdl)
        if kind == "ragged":
            if k is None or v is None:
                raise ValueError("ragged prefill needs this step's k and v (forward(..., k=, v=))")
            return self._active.run(q, k, v, enable_pdl=self.enable_pdl)
        if kind == "paged_prefill":
            # FlashInfer would zero-fill its own output (one extra kernel per layer); every row is written.
            out = torch.empty(q.shape, dtype=self.dtype, device=q.device)
            return self._active.run(q, kv_cache, out=out, enable_pdl=self.enable_pdl)
        return self._active.run(q, kv_cache, enable_pdl=self.enable_pdl)
