"""CUDA-graph executor: prefill runs eager; a decode batch pads up to its bucket and replays that
bucket's captured graph (the whole model, lm_head, float32 logits and optionally greedy argmax).

Padding rows are empty sequences: token 0, position 0, slot -1 (no KV write), kv_indptr repeated
and last_page_len 1, so FlashInfer has well-formed metadata for every row the graph was captured
with (missing per-row metadata for padding rows is the illegal-memory-access bug of xLLM's first
graph executor). FlashInfer's plan() runs on the host before every replay, outside the graph, on
the stream that replays, and copies the page table into the static buffers the graph reads."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from xrt.attention.metadata import AttentionMetadata
from xrt.config import Device, XrtConfig
from xrt.executor.buckets import Buckets
from xrt.executor.runner import ModelRunner
from xrt.executor.step import StepInput

GB = 1 << 30


@dataclass
class DecodeGraph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [bucket, vocab] float32, a view of the shared static logits buffer
    argmax: torch.Tensor | None  # [bucket] int64 when the graph also samples greedily


def stage_decode(
    step: StepInput,
    bucket: int,
    page_size: int,
    max_pages_per_seq: int,
    tokens: np.ndarray,
    kv_indptr: np.ndarray,
    kv_last_page_len: np.ndarray,
    kv_indices: np.ndarray,
) -> int:
    """Write one decode step padded to `bucket` rows into host arrays: tokens [3, >=bucket] (token id,
    position, slot), kv_indptr [>=bucket+1], kv_last_page_len [>=bucket], kv_indices. Padding rows
    are empty sequences (token 0, position 0, slot -1, indptr repeated, last_page_len 1). Returns
    the number of page indices written."""
    n, ps = len(step.seqs), page_size
    if n > bucket:
        raise ValueError(f"{n} sequences do not fit bucket {bucket}")
    kv_indptr[0] = 0
    for i, chunk in enumerate(step.seqs):
        pos = chunk.start_pos
        num_pages = pos // ps + 1
        if len(chunk.token_ids) != 1 or len(chunk.page_table) < num_pages:
            raise ValueError(
                f"step.seqs[{i}]: a decode chunk needs one token and {num_pages} pages, got "
                f"{len(chunk.token_ids)} tokens and {len(chunk.page_table)} pages"
            )
        if num_pages > max_pages_per_seq:
            raise ValueError(
                f"step.seqs[{i}]: position {pos} needs {num_pages} KV pages, the graph buffers hold "
                f"{max_pages_per_seq} per sequence (max_model_len + 1 tokens)"
            )
        tokens[0, i] = chunk.token_ids[0]
        tokens[1, i] = pos
        tokens[2, i] = chunk.page_table[pos // ps] * ps + pos % ps
        start = int(kv_indptr[i])
        kv_indices[start : start + num_pages] = chunk.page_table[:num_pages]
        kv_indptr[i + 1] = start + num_pages
        kv_last_page_len[i] = pos % ps + 1
    tokens[:, n:bucket] = [[0], [0], [-1]]
    kv_indptr[n + 1 : bucket + 1] = kv_indptr[n]
    kv_last_page_len[n:bucket] = 1
    return int(kv_indptr[n])


class DecodeInputs:
    """Static device inputs of every decode graph, sized for the largest bucket, with pinned host
    mirrors: a step's token ids, positions and slots go up in one async copy, and the plan inputs
    (kv_indptr, kv_last_page_len on the host; kv_indices staged on the device) need no sync."""

    def __init__(self, max_batch: int, max_pages_per_seq: int, device: torch.device) -> None:
        self.device_buf = torch.zeros(3, max_batch, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.slot_mapping = self.device_buf.unbind(0)
        self.host_buf = torch.zeros(3, max_batch, dtype=torch.int64, pin_memory=True)
        self.kv_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len = torch.ones(max_batch, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_batch * max_pages_per_seq, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(max_batch * max_pages_per_seq, dtype=torch.int32, device=device)
        self.np_tokens, self.np_indptr = self.host_buf.numpy(), self.kv_indptr.numpy()
        self.np_last, self.np_indices = self.kv_last_page_len.numpy(), self.kv_indices_host.numpy()
        self.consumed = torch.cuda.Event()
        self.consumed.record()

    def wait_writable(self) -> None:
        # The previous step's async copies may still be reading the pinned buffers.
        self.consumed.synchronize()

    def upload(self, bucket: int, num_indices: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Start the copies; returns plan inputs (kv_indptr host, kv_indices device, last_page_len host)."""
        # The whole (contiguous, 3 x max_batch) block: a strided slice would be staged through pageable memory.
        self.device_buf.copy_(self.host_buf, non_blocking=True)
        self.kv_indices[:num_indices].copy_(self.kv_indices_host[:num_indices], non_blocking=True)
        return self.kv_indptr[: bucket + 1], self.kv_indices[:num_indices], self.kv_last_page_len[:bucket]

    def mark_consumed(self) -> None:
        self.consumed.record()


class CudaGraphRunner(ModelRunner):
    def __init__(self, cfg: XrtConfig) -> None:
        if cfg.device is Device.CPU or not torch.cuda.is_available():
            raise ValueError("executor.kind: cudagraph needs a CUDA device")
        super().__init__(cfg)
        from xrt.attention.flashinfer import FlashInferBackend, unsupported_reason

        if not isinstance(self.backend, FlashInferBackend):
            first = self.attention_layers[0]
            reason = unsupported_reason(self.dtype, first.head_dim) or "the runner picked another backend"
            raise ValueError(f"executor.kind: cudagraph needs FlashInfer attention ({reason}); use executor=eager")
        self.fi_backend = self.backend
        self.buckets = Buckets.from_args(cfg.executor)
        self.capture_sampling = cfg.executor.capture_sampling
        # A sequence may reach max_model_len + 1 KV slots (the token generated at the limit is written).
        self.max_pages_per_seq = -(-(self.max_model_len + 1) // self.page_size)
        self.inputs = DecodeInputs(self.buckets.largest, self.max_pages_per_seq, self.device)
        self.graphs: dict[int, DecodeGraph] = {}
        self.last_argmax: torch.Tensor | None = None
        self._metas: dict[int, AttentionMetadata] = {}
        self.capture()

    # -- per-bucket metadata and plan -------------------------------------------------------------

    def _graph_meta(self, bucket: int) -> AttentionMetadata:
        """Metadata the layers read inside the graph: views of the static buffers. The *_host
        fields are unused (planning goes through plan_graph_decode)."""
        bufs = self.fi_backend.graph_buffers
        assert bufs is not None
        empty = torch.zeros(0, dtype=torch.int32)
        rows = torch.arange(bucket + 1, dtype=torch.int32, device=self.device)
        return AttentionMetadata(
            is_prefill=False,
            num_seqs=bucket,
            num_tokens=bucket,
            positions=self.inputs.positions[:bucket],
            slot_mapping=self.inputs.slot_mapping[:bucket],
            qo_indptr=rows,
            kv_indptr=bufs.kv_indptr[: bucket + 1],
            kv_indices=bufs.kv_indices,
            kv_last_page_len=bufs.kv_last_page_len[:bucket],
            seq_lens=torch.zeros(bucket, dtype=torch.int32, device=self.device),
            qo_indptr_host=empty,
            kv_indptr_host=empty,
            kv_indices_host=empty,
            kv_last_page_len_host=empty,
            seq_lens_host=empty,
            logits_indices=rows[:bucket].long(),
            has_prefix=True,
            page_size=self.page_size,
        )

    def _stage_dummy(self, bucket: int) -> None:
        """Inputs for warm-up and capture: every row a one-token sequence on page 0 that writes nothing."""
        inp = self.inputs
        inp.wait_writable()
        inp.np_tokens[:, :bucket] = [[0], [0], [-1]]
        inp.np_indptr[: bucket + 1] = np.arange(bucket + 1)
        inp.np_last[:bucket] = 1
        inp.np_indices[:bucket] = 0
        self.fi_backend.plan_graph_decode(*inp.upload(bucket, bucket))
        inp.mark_consumed()

    def _stage(self, step: StepInput, bucket: int) -> None:
        """Copy one decode step into the static inputs (padding rows after the real ones) and plan."""
        inp = self.inputs
        inp.wait_writable()
        num_indices = stage_decode(
            step, bucket, self.page_size, self.max_pages_per_seq,
            inp.np_tokens, inp.np_indptr, inp.np_last, inp.np_indices,
        )
        self.fi_backend.plan_graph_decode(*inp.upload(bucket, num_indices))
        inp.mark_consumed()

    # -- capture ----------------------------------------------------------------------------------

    def _body(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The captured computation: model forward, lm_head, float32 logits (+ greedy argmax)."""
        meta = self._metas[bucket]
        hidden = self.forward_hidden(self.inputs.input_ids[:bucket], meta)
        logits = self.static_logits[:bucket]
        logits.copy_(self.model.compute_logits(hidden))
        return logits, (logits.argmax(dim=-1) if self.capture_sampling else None)

    def capture(self) -> None:
        sizes = sorted(self.buckets.sizes, reverse=True)
        torch.cuda.synchronize(self.device)
        free_before = torch.cuda.mem_get_info(self.device)[0]
        start = time.perf_counter()
        self.fi_backend.enable_graph_decode(list(self.buckets.sizes), self.max_pages_per_seq)
        vocab = self.model.lm_head.num_embeddings
        self.static_logits = torch.zeros(self.buckets.largest, vocab, dtype=torch.float32, device=self.device)
        self._metas = {b: self._graph_meta(b) for b in sizes}
        stream = torch.cuda.Stream(self.device)
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            # Warm-up: run every bucket once so every Triton specialization and FlashInfer module is
            # compiled and every lazy allocation (cuBLAS workspace of the capture stream) is made
            # before any capture begins.
            for b in sizes:
                self._stage_dummy(b)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    self._body(b)
                torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)
            # Largest first: later (smaller) graphs reuse the shared pool's blocks.
            for b in tqdm(sizes, desc="Capturing decode CUDA graphs", unit="graph", dynamic_ncols=True):
                self._stage_dummy(b)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    logits, argmax = self._body(b)
                self.graphs[b] = DecodeGraph(graph, logits, argmax)
        torch.cuda.synchronize(self.device)
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        print(
            f"[xrt] captured {len(sizes)} decode CUDA graphs (batch {sizes[-1]}..{sizes[0]}) in "
            f"{time.perf_counter() - start:.1f} s using {used / GB:.3f} GiB",
            flush=True,
        )

    # -- execution --------------------------------------------------------------------------------

    def execute(self, step: StepInput) -> torch.Tensor:
        """float32 logits rows for chunks with needs_logits. A replayed decode returns a view of the
        graph's static output, valid until the next execute(); `last_argmax` then holds the greedy
        token of each returned row (computed in the graph), else None."""
        bucket = None if step.is_prefill else self.buckets.bucket_for(len(step.seqs))
        if bucket is None:
            self.last_argmax = None
            return super().execute(step)
        n = len(step.seqs)
        self._stage(step, bucket)
        entry = self.graphs[bucket]
        entry.graph.replay()
        rows = [i for i, chunk in enumerate(step.seqs) if chunk.needs_logits]
        if len(rows) == n:
            self.last_argmax = entry.argmax[:n] if entry.argmax is not None else None
            return entry.logits[:n]
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        self.last_argmax = entry.argmax[index] if entry.argmax is not None else None
        return entry.logits[index]
