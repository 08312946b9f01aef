"""Decode CUDA graphs: a decode batch pads up to its bucket and replays that bucket's captured graph
(input ids gathered on the device, the whole model, lm_head and optionally greedy argmax). `run()`
replays a StepInput (float32 logits back); `launch()` replays a DecodeBatch and returns at once, its
greedy tokens coming back through pinned memory, and a following launch can take its input tokens from
them without a host round trip (the engine's overlapped decoding). The attention backend prepares each
replay outside the graph, on the stream that replays (FlashInfer: plan from host CSR, copying the page
table into the static buffers the graph reads)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from xrt.attention.graph_buffers import GraphDecodeBuffers
from xrt.attention.metadata import AttentionMetadata
from xrt.executor.buckets import Buckets
from xrt.executor.graphs.capture import Graph, capture_each, measured
from xrt.executor.graphs.decode_inputs import (
    DecodeInputs,
    PendingDecode,
    decode_batch,
    stage_capture_rows,
    stage_decode,
)
from xrt.executor.graphs.parts import GraphParts
from xrt.executor.step import DecodeBatch, StepInput
from xrt.log import get_logger
from xrt.units import GiB

log = get_logger(__name__)
# Buckets that also get a graph waiting for KV loads: a load comes with the admission of a few prompts.
WAITING_MAX_BATCH = 4
Waits = Sequence[torch.cuda.Event | None]  # per layer (KVArrivals.graph_waits)


@dataclass
class DecodeGraph:
    graph: Graph
    logits: torch.Tensor  # [bucket, vocab] model dtype, a view of the shared static logits buffer


class DecodeGraphs:
    """loop_max_rows: executor.staging_loop_max_rows (stage_decode's per-row loop vs vectorized)."""

    def __init__(self, parts: GraphParts, buckets: Buckets, max_pages_per_seq: int, loop_max_rows: int) -> None:
        self.parts = parts
        self.buckets = buckets
        self.max_pages_per_seq = max_pages_per_seq
        self.loop_max_rows = loop_max_rows
        self.inputs = DecodeInputs(buckets.largest, max_pages_per_seq, parts.device)
        self.graphs: dict[int, DecodeGraph] = {}
        self.waiting: dict[int, DecodeGraph] = {}  # graphs whose layers wait on the KV loads' events

    def _meta(self, bucket: int, bufs: GraphDecodeBuffers) -> AttentionMetadata:
        """Metadata the layers read inside the graph: views of the static inputs and of the backend's
        static CSR."""
        device = self.parts.device
        rows = torch.arange(bucket + 1, dtype=torch.int32, device=device)
        kv_indptr, kv_indices, kv_last_page_len = bufs.csr(bucket)
        return AttentionMetadata(
            is_prefill=False,
            num_seqs=bucket,
            num_tokens=bucket,
            positions=self.inputs.positions[:bucket],
            slot_mapping=self.inputs.slot_mapping[:bucket],
            qo_indptr=rows,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            kv_last_page_len=kv_last_page_len,
            seq_lens=torch.zeros(bucket, dtype=torch.int32, device=device),
            logits_indices=rows[:bucket].long(),
            has_prefix=True,
            page_size=self.parts.page_size,
        )

    def _prepare(self, bucket: int, num_indices: int) -> None:
        """Upload the staged step (rows [0, bucket) complete) and let the backend prepare its attention."""
        inp = self.inputs
        self.parts.backend.prepare_decode_graph(*inp.upload(bucket, num_indices))
        inp.mark_consumed()

    def _prepare_capture(self, bucket: int) -> None:
        self._prepare(bucket, stage_capture_rows(self.inputs.wait_writable(), bucket))

    def _body(self, bucket: int, meta: AttentionMetadata, waits: Waits | None = None) -> torch.Tensor:
        """The captured computation: input ids gathered from the token pool, model forward (each layer first
        waiting on its KV event, with waits), lm_head into the static logits (model dtype), and greedy argmax
        into the token pool. With waits no launch uses PDL (ForwardContext.pdl): one behind an event wait would
        not overlap it."""
        inp = self.inputs
        input_ids = inp.token_pool.index_select(0, inp.sources[:bucket])
        pdl = waits is None
        hidden = self.parts.forward(input_ids, meta, waits, pdl)
        logits = self.static_logits[:bucket]
        self.parts.logits_into(hidden, logits, inp.argmax[:bucket], pdl)
        return logits

    def capture(self, waits: Waits | None = None) -> None:
        """Every bucket's graph; with `waits` (the KV cache's KVArrivals.graph_waits), also a second graph of
        each bucket up to WAITING_MAX_BATCH whose layers wait on those events, for the step right after a KV
        tier's load (a prompt whose prefix came from L1/L2): its first layers run while the rest still copies."""
        sizes = sorted(self.buckets.sizes, reverse=True)
        parts = self.parts
        with measured(parts.capture) as took:
            bufs = parts.backend.init_decode_graphs(list(self.buckets.sizes), self.max_pages_per_seq)
            self.static_logits = parts.static_logits(self.buckets.largest)
            metas = {b: self._meta(b, bufs) for b in sizes}
            # Largest first: later (smaller) graphs reuse the shared pool's blocks.
            captured = capture_each(
                parts.capture, sizes, self._prepare_capture, lambda b: self._body(b, metas[b]),
                "capturing decode CUDA graphs",
            )
            waiting_sizes = [b for b in sizes if b <= WAITING_MAX_BATCH] if waits is not None else []
            if waiting_sizes:
                waiting = capture_each(
                    parts.capture, waiting_sizes, self._prepare_capture,
                    lambda b: self._body(b, metas[b], waits), "capturing decode CUDA graphs that wait for KV loads",
                )
                self.waiting = {b: DecodeGraph(graph, logits) for b, (graph, logits) in waiting.items()}
        self.graphs = {b: DecodeGraph(graph, logits) for b, (graph, logits) in captured.items()}
        log.info(
            f"captured {len(sizes) + len(waiting_sizes)} decode CUDA graphs (batch {sizes[-1]}..{sizes[0]}"
            + (f", and {len(waiting_sizes)} waiting for KV loads" if waiting_sizes else "")
            + f") in {took.seconds:.1f} s using {took.bytes / GiB:.3f} GiB"
        )

    def stage(self, batch: DecodeBatch, bucket: int, waiting: bool = False) -> DecodeGraph:
        """Stage the batch padded to `bucket`, upload it and prepare the attention: the bucket's graph (the one
        waiting for KV loads, with `waiting`) is ready to replay (scripts replay it again and again to time it)."""
        st = self.inputs.wait_writable()
        num_indices = stage_decode(st, batch, bucket, self.parts.page_size, self.loop_max_rows)
        self._prepare(bucket, num_indices)
        return (self.waiting if waiting else self.graphs)[bucket]

    def _replay(self, batch: DecodeBatch, bucket: int, waiting: bool = False,
                before_replay: Callable[[], object] | None = None) -> DecodeGraph:
        entry = self.stage(batch, bucket, waiting)
        if before_replay is not None:
            before_replay()
        entry.graph.replay()
        return entry

    def run(self, step: StepInput, waiting: bool = False,
            before_replay: Callable[[], object] | None = None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Replay a decode step: (float32 logits of the chunks with needs_logits, their greedy tokens or
        None without argmax; views valid until the next forward pass), or None when the step is above the
        largest bucket (run it eager). waiting: KV loads are still copying (KVArrivals), so only a graph that
        waits for them will do (None where the bucket has none). before_replay: called once the step's inputs
        are staged and uploaded, just before the replay (the runner queues the deferred KV loads there)."""
        n = len(step.seqs)
        bucket = self.buckets.bucket_for(n)
        if bucket is None or (waiting and bucket not in self.waiting):
            return None
        entry = self._replay(decode_batch(step), bucket, waiting, before_replay)
        argmax = self.inputs.argmax if self.parts.argmax else None
        rows = [i for i, chunk in enumerate(step.seqs) if chunk.needs_logits]
        if len(rows) == n:
            return entry.logits[:n].float(), argmax[:n] if argmax is not None else None
        index = torch.tensor(rows, dtype=torch.int64, device=self.parts.device)
        return entry.logits[index].float(), argmax[index] if argmax is not None else None

    def launch(self, batch: DecodeBatch, bucket: int, seq_no: int) -> PendingDecode:
        """Replay a greedy decode step and start copying its tokens back; returns at once."""
        self._replay(batch, bucket)
        return self.inputs.read_back(len(batch), seq_no)
