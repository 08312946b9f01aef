"""CUDA-graph prefill for small batches of fresh prompts: the eager prefill of a few sequences is
host-bound (every layer's GEMMs, Triton kernels and FlashInfer run are dispatched from Python), so a
step in which every sequence starts at position 0 (no cached prefix: FlashInfer's ragged prefill
over this step's own k/v) and that fits a (sequences, tokens) bucket replays a captured graph.

Layout of a replay of S sequence slots and T token slots: the real sequences first, then empty
sequences up to S, then one dummy sequence holding the padding tokens (token 0, slot -1 so nothing
is written to the KV cache, position 0 because a bucket may be longer than the RoPE table); its
causal attention over its own q/k/v is well defined and no real row reads it. qo_indptr therefore
has S + 2 entries and always ends at T, the fixed row count of the wrapper's CUDA-graph plan. Only
the last token of each sequence that wants logits goes through lm_head inside the graph (rows
gathered before the projection), then greedy argmax."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from tqdm import tqdm

from xrt.attention.backend import AttentionBackend
from xrt.attention.flashinfer import GRAPH_PREFILL_INT_WORKSPACE, FlashInferBackend
from xrt.attention.metadata import AttentionMetadata
from xrt.config import ExecutorArgs
from xrt.executor.prepare import build_metadata
from xrt.executor.step import SeqChunk, StepInput
from xrt.kvcache.sizing import peak_bytes_on_scratch_cache

GB = 1 << 30
FIRST_TOKEN_BUCKET = 256

T = TypeVar("T")


def capture_graph(fn: Callable[[], T], pool: Any, stream: torch.cuda.Stream) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture fn() into a new CUDA graph on `stream` from the shared memory pool; returns the graph
    and fn's result (tensors the replays write). The CPU tests replace this function."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = fn()
    return graph, out


def default_token_buckets(max_tokens: int) -> list[int]:
    """256, 512, 1024, ... doubling below max_tokens, then max_tokens itself."""
    out, size = [], FIRST_TOKEN_BUCKET
    while size < max_tokens:
        out.append(size)
        size *= 2
    return [*out, max_tokens]


def seq_buckets(max_seqs: int) -> list[int]:
    """1, 2, 4, ... doubling below max_seqs, then max_seqs itself."""
    out, size = [], 1
    while size < max_seqs:
        out.append(size)
        size *= 2
    return [*out, max_seqs]


@dataclass(frozen=True)
class PrefillShapes:
    seq_sizes: tuple[int, ...]  # ascending
    token_sizes: tuple[int, ...]  # ascending

    @classmethod
    def from_args(cls, args: ExecutorArgs) -> PrefillShapes:
        tokens = args.prefill_graph_token_buckets or default_token_buckets(args.prefill_graph_max_tokens)
        return cls(tuple(seq_buckets(args.prefill_graph_max_seqs)), tuple(sorted(set(tokens))))

    @property
    def max_seqs(self) -> int:
        return self.seq_sizes[-1]

    @property
    def max_tokens(self) -> int:
        return self.token_sizes[-1]

    def all(self) -> list[tuple[int, int]]:
        """Every (sequences, tokens) shape a graph is captured for, largest first."""
        return [(s, t) for t in reversed(self.token_sizes) for s in reversed(self.seq_sizes)]

    def fit(self, step: StepInput) -> tuple[int, int] | None:
        """The smallest shape holding this step, or None when it must run eager: not a prefill, a
        sequence with KV before this step (cached prefix or earlier chunk), an empty chunk, or too
        many sequences or tokens."""
        if not step.is_prefill or len(step.seqs) > self.max_seqs:
            return None
        num_tokens = 0
        for chunk in step.seqs:
            if chunk.start_pos != 0 or not chunk.token_ids:
                return None
            num_tokens += len(chunk.token_ids)
        if num_tokens > self.max_tokens:
            return None
        seqs = next(s for s in self.seq_sizes if s >= len(step.seqs))
        tokens = next(t for t in self.token_sizes if t >= num_tokens)
        return seqs, tokens


def stage_prefill(
    step: StepInput, seqs: int, tokens: int, page_size: int, flat: np.ndarray, qo_indptr: np.ndarray
) -> int:
    """Write one prefill of fresh prompts padded to (seqs, tokens) into host arrays: flat int64
    [>= 3 * tokens + seqs] = token ids, positions, KV slots (tokens each), then the logits rows
    (seqs: the last token of each sequence wanting logits, in order, then row 0); qo_indptr int32
    [>= seqs + 2]. Returns the number of logits rows."""
    n = len(step.seqs)
    if n > seqs:
        raise ValueError(f"{n} sequences do not fit a prefill graph of {seqs}")
    ids, pos, slots = flat[:tokens], flat[tokens : 2 * tokens], flat[2 * tokens : 3 * tokens]
    rows = flat[3 * tokens : 3 * tokens + seqs]
    qo_indptr[0] = 0
    start = num_rows = 0
    for i, chunk in enumerate(step.seqs):
        length = len(chunk.token_ids)
        num_pages = -(-length // page_size)
        if chunk.start_pos != 0:
            raise ValueError(f"step.seqs[{i}]: a graph prefill starts at position 0, got {chunk.start_pos}")
        if len(chunk.page_table) < num_pages:
            raise ValueError(
                f"step.seqs[{i}]: page_table has {len(chunk.page_table)} pages, {length} tokens need {num_pages}"
            )
        end = start + length
        if end > tokens:
            raise ValueError(f"{step.num_tokens} tokens do not fit a prefill graph of {tokens}")
        pages = np.asarray(chunk.page_table[:num_pages], dtype=np.int64)
        ids[start:end] = chunk.token_ids
        pos[start:end] = np.arange(length)
        slots[start:end] = (pages[:, None] * page_size + np.arange(page_size)).ravel()[:length]
        qo_indptr[i + 1] = end
        if chunk.needs_logits:
            rows[num_rows] = end - 1
            num_rows += 1
        start = end
    ids[start:] = 0
    pos[start:] = 0
    slots[start:] = -1
    rows[num_rows:] = 0
    qo_indptr[n + 1 : seqs + 1] = start
    qo_indptr[seqs + 1] = tokens
    return num_rows


def stage_padding(seqs: int, tokens: int, flat: np.ndarray, qo_indptr: np.ndarray) -> None:
    """Warm-up and capture inputs: one-token sequences in the `seqs` slots (empty ones when there
    are fewer tokens) and the dummy holding the rest, every token padding (slot -1: nothing is written)."""
    ones = min(seqs, tokens)
    flat[: 3 * tokens + seqs] = 0
    flat[2 * tokens : 3 * tokens] = -1
    flat[3 * tokens : 3 * tokens + seqs] = np.minimum(np.arange(seqs), tokens - 1)
    qo_indptr[: ones + 1] = np.arange(ones + 1)
    qo_indptr[ones + 1 : seqs + 1] = ones
    qo_indptr[seqs + 1] = tokens


@dataclass
class PrefillGraph:
    graph: torch.cuda.CUDAGraph
    seqs: int
    tokens: int


class GraphHost(Protocol):
    """What the prefill graphs need from the CUDA-graph runner."""

    device: torch.device
    page_size: int
    capture_sampling: bool
    fi_backend: FlashInferBackend
    model: torch.nn.Module

    def forward_hidden(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor: ...


class PrefillGraphs:
    """Static inputs, captured graphs and replay of the prefill shapes. One pinned host block and one
    device block int64 [3 * max_tokens + max_seqs]: a graph of T tokens and S sequences reads token
    ids, positions and slots at [0, T), [T, 2T), [2T, 3T) and its logits rows at [3T, 3T + S), so a
    step is one contiguous upload. Logits [max_seqs, vocab] (model dtype) and greedy tokens are
    static outputs; a replay's rows are valid until the next forward pass."""

    def __init__(self, host: GraphHost, args: ExecutorArgs) -> None:
        self.host = host
        self.shapes = PrefillShapes.from_args(args)
        s_max, t_max = self.shapes.max_seqs, self.shapes.max_tokens
        device = host.device
        self.host_flat = torch.zeros(3 * t_max + s_max, dtype=torch.int64, pin_memory=True)
        self.host_qo = torch.zeros(s_max + 2, dtype=torch.int32, pin_memory=True)
        self.flat_np = self.host_flat.numpy()
        self.qo_np = self.host_qo.numpy()
        self.device_flat = torch.zeros(3 * t_max + s_max, dtype=torch.int64, device=device)
        head = host.model.lm_head  # type: ignore[attr-defined]
        self.logits = torch.zeros(s_max, head.num_embeddings, dtype=head.weight.dtype, device=device)
        self.argmax = torch.zeros(s_max, dtype=torch.int64, device=device)
        self.consumed = torch.cuda.Event()
        self.consumed.record()
        self.graphs: dict[tuple[int, int], PrefillGraph] = {}
        self.replays = 0  # tests count them

    @property
    def static_bytes(self) -> int:
        return static_bytes(self.shapes, self.logits.shape[1], self.logits.element_size())

    # -- per-shape views ----------------------------------------------------------------------------

    def _meta(self, seqs: int, tokens: int) -> AttentionMetadata:
        """What the layers read inside the graph: positions and slots (views of the static block).
        The CSR fields are the backend's static buffers; the *_host fields are unused (planning goes
        through plan_graph_prefill)."""
        bufs = self.host.fi_backend.graph_prefill_buffers
        empty = torch.zeros(0, dtype=torch.int32)
        qo = bufs.qo_indptr[: seqs + 2] if bufs is not None else empty
        return AttentionMetadata(
            is_prefill=True,
            num_seqs=seqs + 1,
            num_tokens=tokens,
            positions=self.device_flat[tokens : 2 * tokens],
            slot_mapping=self.device_flat[2 * tokens : 3 * tokens],
            qo_indptr=qo,
            kv_indptr=qo,
            kv_indices=empty,
            kv_last_page_len=empty,
            seq_lens=empty,
            qo_indptr_host=empty,
            kv_indptr_host=empty,
            kv_indices_host=empty,
            kv_last_page_len_host=empty,
            seq_lens_host=empty,
            logits_indices=self.device_flat[3 * tokens : 3 * tokens + seqs],
            has_prefix=False,
            page_size=self.host.page_size,
        )

    def _upload_and_plan(self, seqs: int, tokens: int) -> None:
        """Copy the staged step to the device and plan its wrapper, on the stream that replays."""
        n = 3 * tokens + seqs
        self.device_flat[:n].copy_(self.host_flat[:n], non_blocking=True)
        self.host.fi_backend.plan_graph_prefill(self.host_qo[: seqs + 2])
        self.consumed.record()

    def _body(self, seqs: int, tokens: int, meta: AttentionMetadata) -> None:
        """The captured computation: forward over every token slot, lm_head over the gathered rows
        into the static logits, greedy argmax."""
        host = self.host
        hidden = host.forward_hidden(self.device_flat[:tokens], meta)
        rows = hidden.index_select(0, meta.logits_indices)
        logits = self.logits[:seqs]
        logits.copy_(host.model.compute_logits(rows))  # type: ignore[operator]
        if host.capture_sampling:
            # Over the model-dtype logits: widening to float32 is exact, so the argmax is the same.
            torch.argmax(logits, dim=-1, out=self.argmax[:seqs])

    # -- capture ------------------------------------------------------------------------------------

    def capture(self, pool: Any, stream: torch.cuda.Stream) -> None:
        shapes = self.shapes.all()
        device = self.host.device
        torch.cuda.synchronize(device)
        free_before = torch.cuda.mem_get_info(device)[0]
        start = time.perf_counter()
        self.host.fi_backend.enable_graph_prefill([(s + 1, t) for s, t in shapes])
        metas = {shape: self._meta(*shape) for shape in shapes}
        current = torch.cuda.current_stream(device)
        with torch.inference_mode():
            # Warm-up: every Triton specialization compiled, every FlashInfer module loaded and every
            # lazy buffer made before the first capture. Each wrapper's first plan fixes its row count.
            for s, t in shapes:
                self.consumed.synchronize()
                stage_padding(s, t, self.flat_np, self.qo_np)
                self._upload_and_plan(s, t)
                stream.wait_stream(current)
                with torch.cuda.stream(stream):
                    self._body(s, t, metas[(s, t)])
                current.wait_stream(stream)
            torch.cuda.synchronize(device)
            bar = tqdm(shapes, desc="Capturing prefill CUDA graphs", unit="graph", dynamic_ncols=True)
            for s, t in bar:
                self.consumed.synchronize()
                stage_padding(s, t, self.flat_np, self.qo_np)
                self._upload_and_plan(s, t)
                meta = metas[(s, t)]
                graph, _ = capture_graph(lambda s=s, t=t, meta=meta: self._body(s, t, meta), pool, stream)
                self.graphs[(s, t)] = PrefillGraph(graph, s, t)
        torch.cuda.synchronize(device)
        used = free_before - torch.cuda.mem_get_info(device)[0]
        print(
            f"[xrt] captured {len(shapes)} prefill CUDA graphs (sequences {list(self.shapes.seq_sizes)} x tokens "
            f"{list(self.shapes.token_sizes)}) in {time.perf_counter() - start:.1f} s using {used / GB:.3f} GiB",
            flush=True,
        )

    # -- replay -------------------------------------------------------------------------------------

    def run(self, step: StepInput) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Replay the step's graph: (float32 logits [rows wanting logits, vocab], their greedy tokens
        or None without capture_sampling); None when the step does not fit a graph (run it eager)."""
        shape = self.shapes.fit(step)
        if shape is None or shape not in self.graphs:
            return None
        s, t = shape
        # The previous step's upload may still be reading the pinned block.
        self.consumed.synchronize()
        num_rows = stage_prefill(step, s, t, self.host.page_size, self.flat_np, self.qo_np)
        self._upload_and_plan(s, t)
        self.graphs[shape].graph.replay()
        self.replays += 1
        argmax = self.argmax[:num_rows] if self.host.capture_sampling else None
        return self.logits[:num_rows].float(), argmax


# -- KV sizing --------------------------------------------------------------------------------------


def static_bytes(shapes: PrefillShapes, vocab: int, logit_bytes: int) -> int:
    """Device memory of the static inputs and outputs, FlashInfer's indptr buffers and integer workspace."""
    s_max, t_max = shapes.max_seqs, shapes.max_tokens
    ours = 8 * (3 * t_max + s_max) + s_max * vocab * logit_bytes + 8 * s_max
    return ours + 2 * 4 * (s_max + 2) + GRAPH_PREFILL_INT_WORKSPACE


class ProfiledHost(Protocol):
    device: torch.device
    dtype: torch.dtype
    page_size: int
    attention_layers: list[Any]
    backend: AttentionBackend
    model: torch.nn.Module

    def forward_hidden(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor: ...


def padding_step(seqs: int, tokens: int, page_size: int) -> StepInput:
    """A capture layout of (seqs, tokens) as a StepInput: one-token sequences, then one holding the
    rest (every page table points at page 0; the caller turns every slot into -1)."""
    ones = min(seqs, tokens)
    chunks = [SeqChunk([0], 0, [0]) for _ in range(ones)]
    if tokens > ones:
        rest = tokens - ones
        chunks.append(SeqChunk([0] * rest, 0, [0] * -(-rest // page_size), needs_logits=False))
    return StepInput(is_prefill=True, seqs=chunks)


def graph_pool_bytes(host: ProfiledHost, seqs: int, tokens: int) -> int:
    """Peak torch allocations of the largest prefill graph's computation run eagerly: about what the
    graphs' memory pool keeps for good. Nothing is written to the KV cache (every slot is -1)."""
    input_ids, meta = build_metadata(padding_step(seqs, tokens, host.page_size), host.page_size, host.device)
    meta.slot_mapping.fill_(-1)

    def run() -> None:
        with torch.inference_mode():
            host.backend.plan(meta)
            hidden = host.forward_hidden(input_ids, meta)
            host.model.compute_logits(hidden[meta.logits_indices])  # type: ignore[operator]

    return peak_bytes_on_scratch_cache(host, 1, run)
