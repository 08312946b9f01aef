"""CUDA-graph executor: prefill runs eager; a decode batch pads up to its bucket and replays that
bucket's captured graph (input ids gathered on the device, the whole model, lm_head and optionally
greedy argmax). `execute()` returns float32 logits; `launch_decode()` replays a step the engine
staged itself and returns at once, its greedy tokens coming back through pinned memory, and a
following launch can take its input tokens from them without a host round trip (the engine's
overlapped decoding).

Padding rows are empty sequences: token 0, position 0, slot -1 (no KV write), kv_indptr repeated
and last_page_len 1, so FlashInfer has well-formed metadata for every row the graph was captured
with (missing per-row metadata for padding rows is the illegal-memory-access bug of xLLM's first
graph executor). FlashInfer's plan() runs on the host before every replay, outside the graph, on
the stream that replays, and copies the page table into the static buffers the graph reads.

With executor.prefill_graph, small prefills of fresh prompts replay graphs too
(`xrt.executor.prefill_graph`), captured after the decode graphs into the same memory pool."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from xrt.attention.metadata import AttentionMetadata
from xrt.config import Device, XrtConfig
from xrt.executor.buckets import Buckets
from xrt.executor.interface import PendingTokens
from xrt.executor.prefill_graph import PrefillGraphs, PrefillShapes, capture_graph, graph_pool_bytes, static_bytes
from xrt.executor.prepare import DecodeStaging, pad_decode_rows, stage_decode_rows
from xrt.executor.runner import ModelRunner
from xrt.executor.step import DecodeBatch, StepInput

GB = 1 << 30


@dataclass
class DecodeGraph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [bucket, vocab] model dtype, a view of the shared static logits buffer


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
    mirrors (the `staging` arrays are their numpy views). One device block [5, max_batch] int64:
    row 0 the greedy tokens the last replay wrote, rows 1..4 a step's host token ids, positions,
    slots and token sources, uploaded in one async copy. Rows 0 and 1 together are the token pool a
    graph gathers its input ids from (source r < max_batch: the last replay's token of row r;
    max_batch + i: the host token of row i). The plan inputs (kv_indptr, kv_last_page_len on the
    host; kv_indices staged on the device) need no sync. Greedy tokens come back through a ring of
    pinned buffers, one per launch that may be in flight."""

    RING = 2  # launches in flight at once: one running, one queued behind it

    def __init__(self, max_batch: int, max_pages_per_seq: int, device: torch.device) -> None:
        self.max_batch = max_batch
        self.device_buf = torch.zeros(5, max_batch, dtype=torch.int64, device=device)
        self.argmax = self.device_buf[0]
        self.token_pool = self.device_buf[:2].view(-1)
        self.positions, self.slot_mapping, self.sources = self.device_buf[2:].unbind(0)
        self._device_inputs = self.device_buf[1:]
        self.host_buf = torch.zeros(4, max_batch, dtype=torch.int64, pin_memory=True)
        self.kv_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len = torch.ones(max_batch, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_batch * max_pages_per_seq, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(max_batch * max_pages_per_seq, dtype=torch.int32, device=device)
        self.staging = DecodeStaging(
            rows=self.host_buf.numpy(),
            kv_indptr=self.kv_indptr.numpy(),
            kv_last_page_len=self.kv_last_page_len.numpy(),
            kv_indices=self.kv_indices_host.numpy(),
        )
        self._host_sources = np.arange(max_batch, 2 * max_batch, dtype=np.int64)
        self.consumed = torch.cuda.Event()
        self.consumed.record()
        self.out_host = torch.zeros(self.RING, max_batch, dtype=torch.int64, pin_memory=True)
        self.out_rows = list(self.out_host.unbind(0))
        self.out_np = [row.numpy() for row in self.out_rows]
        self.out_ready = [torch.cuda.Event() for _ in range(self.RING)]
        self.next_out = 0
        # Plan inputs of each batch size, made once (a view per step costs host time).
        self._plan_views = [(self.kv_indptr[: b + 1], self.kv_last_page_len[:b]) for b in range(max_batch + 1)]

    def wait_writable(self) -> DecodeStaging:
        # The previous step's async copies may still be reading the pinned buffers.
        self.consumed.synchronize()
        return self.staging

    def upload(self, bucket: int, num_indices: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Start the copies; returns plan inputs (kv_indptr host, kv_indices device, last_page_len host)."""
        src = self.staging.rows[3, :bucket]
        np.copyto(src, self._host_sources[:bucket], where=src < 0)
        # The whole (contiguous, 4 x max_batch) block: a strided slice would be staged through pageable memory.
        self._device_inputs.copy_(self.host_buf, non_blocking=True)
        indices = self.kv_indices[:num_indices]
        indices.copy_(self.kv_indices_host[:num_indices], non_blocking=True)
        indptr, last = self._plan_views[bucket]
        return indptr, indices, last

    def mark_consumed(self) -> None:
        self.consumed.record()

    def read_back(self, n: int, seq_no: int) -> PendingDecode:
        """Copy the greedy tokens of the replay just launched to the host, behind it on the stream."""
        slot = self.next_out
        self.next_out = (slot + 1) % self.RING
        self.out_rows[slot].copy_(self.argmax, non_blocking=True)
        self.out_ready[slot].record()
        return PendingDecode(self.out_ready[slot], self.out_np[slot], n, seq_no)


class PendingDecode:
    """The greedy tokens of a launched decode step, readable once the device has produced them."""

    def __init__(self, ready: torch.cuda.Event, host: np.ndarray, n: int, seq_no: int) -> None:
        self._ready = ready
        self._host = host
        self.n = n
        self.seq_no = seq_no

    def tokens(self) -> list[int]:
        self._ready.synchronize()
        return self._host[: self.n].tolist()


class CudaGraphRunner(ModelRunner):
    def __init__(self, cfg: XrtConfig) -> None:
        if cfg.device is Device.CPU or not torch.cuda.is_available():
            raise ValueError("executor.kind: cudagraph needs a CUDA device")
        # Set before the base constructor: it runs prefill steps through execute() to size the KV cache.
        self.buckets = Buckets.from_args(cfg.executor)
        self.graphs: dict[int, DecodeGraph] = {}
        self.prefill_graphs: PrefillGraphs | None = None
        self.last_argmax: torch.Tensor | None = None
        # Counts forward passes; a launch may take tokens from the previous one only.
        self._num_passes = 0
        super().__init__(cfg)
        from xrt.attention.flashinfer import FlashInferBackend, unsupported_reason

        if not isinstance(self.backend, FlashInferBackend):
            first = self.attention_layers[0]
            reason = unsupported_reason(self.dtype, first.head_dim) or "the runner picked another backend"
            raise ValueError(f"executor.kind: cudagraph needs FlashInfer attention ({reason}); use executor=eager")
        self.fi_backend = self.backend
        self.capture_sampling = cfg.executor.capture_sampling
        # The engine launches greedy decode steps itself (launch_decode) up to this many sequences.
        self.decode_capacity = self.buckets.largest if self.capture_sampling else 0
        # A sequence may reach max_model_len + 1 KV slots (the token generated at the limit is written).
        self.max_pages_per_seq = -(-(self.max_model_len + 1) // self.page_size)
        self.inputs = DecodeInputs(self.buckets.largest, self.max_pages_per_seq, self.device)
        self._metas: dict[int, AttentionMetadata] = {}
        self.capture()
        if cfg.executor.prefill_graph:
            self.prefill_graphs = PrefillGraphs(self, cfg.executor)
            self.prefill_graphs.capture(self._pool, self._stream)

    def _num_pages(self) -> int:
        """Sized from memory, the KV cache also leaves room for the prefill graphs: their share of the
        graph memory pool (about the peak activations of the largest one) and their static buffers."""
        pages = super()._num_pages()
        ex = self.cfg.executor
        if self.cfg.cache.num_pages or not ex.prefill_graph:
            return pages
        shapes = PrefillShapes.from_args(ex)
        head = self.model.lm_head
        pool = graph_pool_bytes(self, shapes.max_seqs, shapes.max_tokens)
        reserve = pool + static_bytes(shapes, head.num_embeddings, head.weight.element_size())
        cut = -(-reserve // self.bytes_per_page)
        print(
            f"[xrt] KV cache: {cut} of {pages} pages ({reserve / GB:.2f} GiB) left to the prefill graphs "
            f"(pool {pool / GB:.2f} GiB for {shapes.max_seqs} sequences x {shapes.max_tokens} tokens)",
            flush=True,
        )
        if pages - cut < 1:
            raise ValueError(
                f"executor.prefill_graph_max_tokens: prefill graphs of {shapes.max_tokens} tokens leave no room "
                f"for the KV cache; lower it, set executor.prefill_graph=false, or set cache.num_pages"
            )
        return pages - cut

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

    def _plan(self, bucket: int, num_indices: int) -> None:
        """Upload the staged step (rows [0, bucket) complete) and plan; the caller replays next."""
        inp = self.inputs
        self.fi_backend.plan_graph_decode(*inp.upload(bucket, num_indices))
        inp.mark_consumed()

    def _stage_dummy(self, bucket: int) -> None:
        """Inputs for warm-up and capture: every row a one-token sequence on page 0 that writes nothing."""
        st = self.inputs.wait_writable()
        st.kv_indptr[0] = 0
        pad_decode_rows(st, 0, bucket)
        st.kv_indptr[: bucket + 1] = np.arange(bucket + 1)
        st.kv_indices[:bucket] = 0
        self._plan(bucket, bucket)

    def _stage(self, step: StepInput, bucket: int) -> None:
        """Copy one decode step into the static inputs (padding rows after the real ones) and plan."""
        st = self.inputs.wait_writable()
        num_indices = stage_decode(
            step, bucket, self.page_size, self.max_pages_per_seq,
            st.rows[:3], st.kv_indptr, st.kv_last_page_len, st.kv_indices,
        )
        st.rows[3, :bucket] = -1
        self._plan(bucket, num_indices)

    # -- capture ----------------------------------------------------------------------------------

    def _body(self, bucket: int) -> torch.Tensor:
        """The captured computation: input ids gathered from the token pool, model forward, lm_head
        into the static logits (model dtype), and greedy argmax into the token pool."""
        meta = self._metas[bucket]
        input_ids = self.inputs.token_pool.index_select(0, self.inputs.sources[:bucket])
        hidden = self.forward_hidden(input_ids, meta)
        logits = self.static_logits[:bucket]
        logits.copy_(self.model.compute_logits(hidden))
        if self.capture_sampling:
            # Over the model-dtype logits: widening to float32 is exact, so the argmax is the same.
            torch.argmax(logits, dim=-1, out=self.inputs.argmax[:bucket])
        return logits

    def capture(self) -> None:
        sizes = sorted(self.buckets.sizes, reverse=True)
        torch.cuda.synchronize(self.device)
        free_before = torch.cuda.mem_get_info(self.device)[0]
        start = time.perf_counter()
        self.fi_backend.enable_graph_decode(list(self.buckets.sizes), self.max_pages_per_seq)
        head = self.model.lm_head
        self.static_logits = torch.zeros(
            self.buckets.largest, head.num_embeddings, dtype=head.weight.dtype, device=self.device
        )
        self._metas = {b: self._graph_meta(b) for b in sizes}
        # Kept for the prefill graphs, captured after these into the same pool.
        self._stream = stream = torch.cuda.Stream(self.device)
        self._pool = pool = torch.cuda.graph_pool_handle()
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
                graph, logits = capture_graph(lambda b=b: self._body(b), pool, stream)
                self.graphs[b] = DecodeGraph(graph, logits)
        torch.cuda.synchronize(self.device)
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        print(
            f"[xrt] captured {len(sizes)} decode CUDA graphs (batch {sizes[-1]}..{sizes[0]}) in "
            f"{time.perf_counter() - start:.1f} s using {used / GB:.3f} GiB",
            flush=True,
        )

    # -- execution --------------------------------------------------------------------------------

    def execute(self, step: StepInput) -> torch.Tensor:
        """float32 logits rows for chunks with needs_logits. After a replayed decode `last_argmax`
        holds the greedy token of each returned row (computed in the graph; a view valid until the
        next forward pass), else None."""
        self._num_passes += 1
        if step.is_prefill and self.prefill_graphs is not None:
            replayed = self.prefill_graphs.run(step)
            if replayed is not None:
                logits, self.last_argmax = replayed
                return logits
        bucket = None if step.is_prefill or not self.graphs else self.buckets.bucket_for(len(step.seqs))
        if bucket is None:
            self.last_argmax = None
            return super().execute(step)
        n = len(step.seqs)
        self._stage(step, bucket)
        entry = self.graphs[bucket]
        entry.graph.replay()
        argmax = self.inputs.argmax if self.capture_sampling else None
        rows = [i for i, chunk in enumerate(step.seqs) if chunk.needs_logits]
        if len(rows) == n:
            self.last_argmax = argmax[:n] if argmax is not None else None
            return entry.logits[:n].float()
        index = torch.tensor(rows, dtype=torch.int64, device=self.device)
        self.last_argmax = argmax[index] if argmax is not None else None
        return entry.logits[index].float()

    def launch_decode(self, batch: DecodeBatch, after: PendingTokens | None) -> PendingDecode:
        """Stage the batch into the pinned inputs, replay the decode graph for its n sequences and start
        copying their greedy tokens back; returns at once. Sources r >= 0 read the tokens of `after`, which
        must be the previous forward pass (they never left the device)."""
        n = len(batch)
        bucket = self.buckets.bucket_for(n) if self.capture_sampling else None
        if bucket is None:
            raise ValueError(f"launch_decode: {n} sequences exceed the largest graph ({self.decode_capacity})")
        if after is not None and getattr(after, "seq_no", None) != self._num_passes:
            raise RuntimeError("launch_decode: `after` is not the previous forward pass; its tokens are gone")
        st = self.inputs.wait_writable()
        stage_decode_rows(
            st, self.page_size, batch.token_ids, batch.sources, batch.positions, batch.page_tables, batch.table_rows
        )
        self._num_passes += 1
        pad_decode_rows(st, n, bucket)
        self._plan(bucket, int(st.kv_indptr[bucket]))
        self.graphs[bucket].graph.replay()
        self.last_argmax = None
        return self.inputs.read_back(n, self._num_passes)
