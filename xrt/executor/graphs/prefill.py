"""CUDA-graph prefill for small batches of fresh prompts: the eager prefill of a few sequences is
host-bound (every layer's GEMMs, Triton kernels and attention run are dispatched from Python), so a
step in which every sequence starts at position 0 (no cached prefix: the backend's ragged prefill over
this step's own k/v) and that fits a (sequences, tokens) shape replays a captured graph. Shapes and
staging: `xrt.executor.graphs.prefill_inputs`. Captured after the decode graphs, into the same pool."""

from __future__ import annotations

import torch

from xrt.attention.metadata import AttentionMetadata
from xrt.executor.buffers import StagedBuffer, device_event, host_tensor
from xrt.executor.graphs.capture import Graph, capture_each, measured
from xrt.executor.graphs.parts import GraphParts
from xrt.executor.graphs.prefill_inputs import PrefillShapes, padding_step, stage_padding, stage_prefill
from xrt.executor.memory import ProfiledRunner, peak_bytes_on_scratch_cache
from xrt.executor.prepare import build_metadata
from xrt.executor.step import StepInput
from xrt.kvcache.sizing import KVReserve
from xrt.log import get_logger
from xrt.units import GiB

log = get_logger(__name__)


# The parts of a prefill shape's computation a graph is captured for.
PART_ALL, PART_HEAD, PART_TAIL = 0, 1, 2


class GraphChain:
    """Graphs replayed back to back as one: a prefill shape's head and tail."""

    def __init__(self, graphs: list[Graph]) -> None:
        self.graphs = graphs

    def replay(self) -> None:
        for graph in self.graphs:
            graph.replay()


class PrefillGraphs:
    """Static inputs, captured graphs and replay of the prefill shapes. One pinned host block and one
    device block int64 [3 * max_tokens + max_seqs]: a graph of T tokens and S sequences reads token
    ids, positions and slots at [0, T), [T, 2T), [2T, 3T) and its logits rows at [3T, 3T + S), so a
    step is one contiguous upload. Logits [max_seqs, vocab] (model dtype) and greedy tokens are
    static outputs; a replay's rows are valid until the next forward pass."""

    def __init__(self, parts: GraphParts, shapes: PrefillShapes, head_layers: int = 0) -> None:
        """head_layers: executor.prefill_graph_head_layers (0: one graph a shape)."""
        self.parts = parts
        self.shapes = shapes
        self.head_layers = head_layers
        # Between a shape's head and tail (captures, warm-ups and CPU re-runs): the head's (hidden, residual).
        self._between: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        s_max, t_max = shapes.max_seqs, shapes.max_tokens
        device = parts.device
        self.flat = StagedBuffer((3 * t_max + s_max,), torch.int64, device)
        self.qo = host_tensor((s_max + 2,), torch.int32, device)
        self.qo_np = self.qo.numpy()
        self.logits = parts.static_logits(s_max)
        self.argmax = torch.zeros(s_max, dtype=torch.int64, device=device)
        self.consumed = device_event(device)
        self.consumed.record()
        self.graphs: dict[tuple[int, int], Graph] = {}
        self.replays = 0  # tests count them

    def _meta(self, seqs: int, tokens: int, qo_static: torch.Tensor) -> AttentionMetadata:
        """What the layers read inside the graph: positions and slots (views of the static block) and the
        backend's static qo_indptr, which is also the KV CSR (each sequence attends over its own tokens)."""
        qo = qo_static[: seqs + 2]
        empty = torch.zeros(0, dtype=torch.int32, device=self.parts.device)
        flat = self.flat.dev
        return AttentionMetadata(
            is_prefill=True,
            num_seqs=seqs + 1,
            num_tokens=tokens,
            positions=flat[tokens : 2 * tokens],
            slot_mapping=flat[2 * tokens : 3 * tokens],
            qo_indptr=qo,
            kv_indptr=qo,
            kv_indices=empty,
            kv_last_page_len=empty,
            seq_lens=empty,
            logits_indices=flat[3 * tokens : 3 * tokens + seqs],
            has_prefix=False,
            page_size=self.parts.page_size,
        )

    def _prepare(self, seqs: int, tokens: int) -> None:
        """Copy the staged step to the device and let the backend prepare it, on the stream that replays."""
        self.flat.upload(3 * tokens + seqs)
        self.parts.backend.prepare_prefill_graph(self.qo[: seqs + 2])
        self.consumed.record()

    def _prepare_capture(self, shape: tuple[int, int]) -> None:
        self.consumed.synchronize()
        stage_padding(*shape, self.flat.np, self.qo_np)
        self._prepare(*shape)

    def _body(self, key: tuple[tuple[int, int], int], meta: AttentionMetadata) -> None:
        """The captured computation of a shape's part (PART_ALL, PART_HEAD, PART_TAIL): forward over every token
        slot, lm_head over the gathered rows into the static logits, greedy argmax. A head leaves its output in
        _between for its tail: tensors of the graphs' pool, which no other graph can overwrite in between, as
        nothing replays between a head and its tail, and which later captures may reuse as every replay of the
        head writes them again before its tail reads them."""
        shape, part = key
        seqs, tokens = shape
        if part == PART_HEAD:
            self._between[shape] = self.parts.forward_head(self.flat.dev[:tokens], meta, self.head_layers)
            return
        if part == PART_TAIL:
            hidden = self.parts.forward_tail(*self._between.pop(shape), meta, self.head_layers)
        else:
            hidden = self.parts.forward(self.flat.dev[:tokens], meta)
        rows = hidden.index_select(0, meta.logits_indices)
        self.parts.logits_into(rows, self.logits[:seqs], self.argmax[:seqs])

    def _keys(self) -> list[tuple[tuple[int, int], int]]:
        """(shape, part) in capture order: a shape's head right before its tail."""
        parts = (PART_HEAD, PART_TAIL) if self.head_layers > 0 else (PART_ALL,)
        return [(shape, part) for shape in self.shapes.all() for part in parts]

    def capture(self) -> None:
        shapes = self.shapes.all()
        parts = self.parts
        with measured(parts.capture) as took:
            qo_static = parts.backend.init_prefill_graphs([(s + 1, t) for s, t in shapes])
            metas = {shape: self._meta(*shape, qo_static) for shape in shapes}
            # Each graph's attention fixes its row count at its first preparation: always `tokens` rows.
            captured = capture_each(
                parts.capture, self._keys(), lambda key: self._prepare_capture(key[0]),
                lambda key: self._body(key, metas[key[0]]), "capturing prefill CUDA graphs",
            )
        chains: dict[tuple[int, int], list[Graph]] = {}
        for (shape, _), (graph, _) in captured.items():
            chains.setdefault(shape, []).append(graph)
        self.graphs = {shape: chain[0] if len(chain) == 1 else GraphChain(chain) for shape, chain in chains.items()}
        split = f", each as a head of {self.head_layers} layers and a tail" if self.head_layers > 0 else ""
        log.info(
            f"captured {len(shapes)} prefill CUDA graphs (sequences {list(self.shapes.seq_sizes)} x tokens "
            f"{list(self.shapes.token_sizes)}{split}) in {took.seconds:.1f} s using {took.bytes / GiB:.3f} GiB"
        )

    def run(self, step: StepInput) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Replay the step's graph: (float32 logits [rows wanting logits, vocab], their greedy tokens
        or None without argmax); None when the step does not fit a graph (run it eager)."""
        shape = self.shapes.fit(step)
        if shape is None or shape not in self.graphs:
            return None
        s, t = shape
        # The previous step's upload may still be reading the pinned block.
        self.consumed.synchronize()
        num_rows = stage_prefill(step, s, t, self.parts.page_size, self.flat.np, self.qo_np)
        self._prepare(s, t)
        self.graphs[shape].replay()
        self.replays += 1
        argmax = self.argmax[:num_rows] if self.parts.argmax else None
        return self.logits[:num_rows].float(), argmax


# -- what the prefill graphs take from the KV cache's memory ---------------------------------------


def static_bytes(shapes: PrefillShapes, vocab: int, logit_bytes: int, backend_bytes: int) -> int:
    """Device memory of the static inputs and outputs, plus the backend's graph buffers (backend_bytes:
    AttentionBackend.prefill_graph_bytes)."""
    s_max, t_max = shapes.max_seqs, shapes.max_tokens
    return 8 * (3 * t_max + s_max) + s_max * vocab * logit_bytes + 8 * s_max + backend_bytes


def graph_pool_bytes(runner: ProfiledRunner, seqs: int, tokens: int) -> int:
    """Peak torch allocations of the largest prefill graph's computation run eagerly: about what the
    graphs' memory pool keeps for good. Nothing is written to the KV cache (every slot is -1). On CPU,
    where graphs keep no device pool, 0."""
    if runner.device.type != "cuda":
        return 0
    input_ids, meta = build_metadata(padding_step(seqs, tokens, runner.page_size), runner.page_size, runner.device)
    meta.slot_mapping.fill_(-1)

    def run() -> None:
        with torch.inference_mode():
            runner.run_model(input_ids, meta)

    return peak_bytes_on_scratch_cache(runner, 1, run)


def prefill_reserve(shapes: PrefillShapes, pool: int, static: int) -> KVReserve:
    """The KV cache leaves the prefill graphs their share of the graph memory pool (about the peak
    activations of the largest one, `pool`) and their static buffers."""
    return KVReserve(
        pool + static,
        f"the prefill graphs (pool {pool / GiB:.2f} GiB for {shapes.max_seqs} sequences x {shapes.max_tokens} tokens)",
        f"executor.prefill_graph_max_tokens: prefill graphs of {shapes.max_tokens} tokens leave no room for the KV "
        f"cache; lower it, set executor.prefill_graph=false, or set cache.num_pages",
    )
