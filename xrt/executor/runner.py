"""The model runner, one class for every executor kind: builds the model on its device, loads weights (or
dummy ones), picks the attention backend, sizes and allocates the paged KV cache (`xrt.kvcache`), and runs
one step at a time. With executor=cudagraph it then builds the graph managers beside it from explicit parts
(`xrt.executor.graphs`: decode graphs, and prefill graphs with executor.prefill_graph) and replays them
where a step fits; everything else runs eager."""

from __future__ import annotations

import functools
import importlib
import math
import os
import time
from typing import TYPE_CHECKING

import torch

from xrt.attention.backend import AttentionBackend, AttentionShape
from xrt.attention.context import forward_context
from xrt.attention.metadata import AttentionMetadata
from xrt.attention.select import make_backend
from xrt.config import Device, ExecutorKind, KVTiers, ModelArgs, XrtConfig
from xrt.executor.buckets import Buckets
from xrt.executor.device import resolve_device, resolve_dtype
from xrt.executor.graphs.capture import CaptureStrategy, CudaGraphCapture
from xrt.executor.graphs.decode import DecodeGraphs
from xrt.executor.graphs.decode_inputs import PendingDecode
from xrt.executor.graphs.parts import GraphParts
from xrt.executor.graphs.prefill import PrefillGraphs, graph_pool_bytes, prefill_reserve, static_bytes
from xrt.executor.graphs.prefill_inputs import PrefillShapes
from xrt.executor.interface import PendingTokens
from xrt.executor.memory import peak_activation_bytes
from xrt.executor.prepare import build_metadata
from xrt.executor.step import DecodeBatch, StepInput, as_decode
from xrt.kvcache.connector import NoTierConnector, TierConnector
from xrt.kvcache.device import DeviceKVCache, KVLayout, wait_all
from xrt.kvcache.plan import TierPlan
from xrt.kvcache.sizing import KVReserve, num_pages
from xrt.layers.attention import PagedAttention
from xrt.layers.options import LayerOptions
from xrt.log import get_logger, set_level
from xrt.models.checkpoint import resolve_checkpoint
from xrt.models.errors import CheckpointError, TensorError
from xrt.models.hf_config import check_shape_keys
from xrt.models.loader import file_of, iter_weights, read_hf_config
from xrt.models.qwen3 import Qwen3ForCausalLM
from xrt.models.registry import DEFAULT_ARCHITECTURE, architecture_of, model_class
from xrt.ops.collectives import min_over_ranks
from xrt.ops.parallel_state import TPState, init_tp
from xrt.reflect import hf_values
from xrt.units import GiB

if TYPE_CHECKING:  # the tiers (and NIXL) load only with cache.tiers set
    from xrt.kvstore.agent import TierAgent

log = get_logger(__name__)

KVReady = tuple[torch.cuda.Event | None, ...]  # per layer (xrt.kvcache.device.KVArrivals.take)


class ModelRunner:
    """capture: how graphs are taken with executor=cudagraph; None takes CUDA graphs, which need a CUDA
    device. The CPU tests pass `RerunCapture()` to run the graph managers on CPU. tp: this rank's tensor-parallel
    state, which `xrt.distributed` builds for each of its ranks (None: one rank at parallel.tp=1, else the default
    torch.distributed group's). The model is built with it and with `LayerOptions.of(cfg.executor)`, both kept
    here (`tp_state`, `options`): nothing of this runner's is process-wide."""

    def __init__(self, cfg: XrtConfig, capture: CaptureStrategy | None = None, tp: TPState | None = None) -> None:
        graphs = cfg.executor.kind is ExecutorKind.CUDAGRAPH
        if graphs and capture is None and (cfg.device is Device.CPU or not torch.cuda.is_available()):
            raise ValueError("executor.kind: cudagraph needs a CUDA device")
        # torch.library custom ops import torch._dynamo (seconds) on their first call; pay that at
        # startup rather than in the first request's time to first token.
        importlib.import_module("torch._dynamo")

        self.cfg = cfg
        set_level(cfg.log_level.value)  # so that LLM(cfg) from Python honours log_level, as the CLI does
        self.tp_state = init_tp(cfg.parallel.tp, tp)
        self.options = LayerOptions.of(cfg.executor)
        self.device = resolve_device(cfg)
        self.dtype = resolve_dtype(cfg, self.device)
        self.page_size = cfg.cache.page_size
        self.max_model_len = cfg.model.max_model_len
        # A sequence may reach max_model_len + 1 KV slots (the token generated at the limit is written).
        self.max_pages_per_seq = -(-(self.max_model_len + 1) // self.page_size)
        self.checkpoint_dir = resolve_checkpoint(cfg.model)
        started = time.perf_counter()
        self.model = self._build_model()
        self._log_model(time.perf_counter() - started)
        self.vocab_size = cfg.model.vocab_size
        # Most sequences one launch_decode takes (greedy decode graphs with argmax inside); 0: none.
        self.decode_capacity = 0
        self.last_argmax: torch.Tensor | None = None
        self.decode_graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        # Counts forward passes; a launch may take tokens from the previous one only.
        self._num_passes = 0
        # The runner owns its memory, in this order: the weights (above), the attention backend, a warm-up prefill
        # that measures the peak activations (on CUDA), the KV cache from what is left, then the graphs.
        self._bind_attention(graphs)
        prefill_shapes = PrefillShapes.from_args(cfg.executor) if graphs and cfg.executor.prefill_graph else None
        self.num_pages = self._size_kv_cache(prefill_shapes)
        self.kv_cache = self._allocate_kv_cache()
        log.debug(f"KV cache: {self.num_pages} pages of {self.page_size} tokens ({self.num_pages * self.page_size} "
                  f"tokens, {self.num_pages * self.kv_layout.bytes_per_page / GiB:.3f} GiB, "
                  f"{self.kv_layout.bytes_per_page} B/page) on {self.device}; attention "
                  f"{type(self.backend).__name__}; executor {cfg.executor.kind.value}")
        if graphs:
            self._build_graphs(capture or CudaGraphCapture(self.device), prefill_shapes)

    def _log_model(self, seconds: float) -> None:
        """-v: what was built, from where, and what it costs, also at tp=1 (where the rest of start-up logs nothing
        on CPU)."""
        params = list(self.model.parameters())
        count, nbytes = sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)
        source = str(self.checkpoint_dir) if self.checkpoint_dir else f"dummy weights (seed {self.cfg.seed})"
        rank = f", rank {self.tp_state.rank} of {self.tp_state.size}" if self.tp_state.size > 1 else ""
        log.debug(f"model: {self.cfg.model.name}, {count / 1e6:.1f}M parameters ({nbytes / GiB:.3f} GiB), "
                  f"{str(self.dtype).removeprefix('torch.')} on {self.device}{rank}, from {source} in {seconds:.2f} s")

    def _bind_attention(self, graphs: bool) -> None:
        self.attention_layers = sorted(
            (m for m in self.model.modules() if isinstance(m, PagedAttention)), key=lambda m: m.layer_idx
        )
        first = self.attention_layers[0]
        shape = AttentionShape(first.num_heads, first.num_kv_heads, first.head_dim, self.page_size, self.dtype,
                               self.device)
        ex = self.cfg.executor
        self.backend: AttentionBackend = make_backend(shape, ex.workspace_mb, self.max_pages_per_seq,
                                                      ex.fuse_qk_norm_rope, ex.prefill_attention.value)
        requirement = self.backend.graph_requirement() if graphs else None
        if requirement:
            raise ValueError(f"executor.kind: cudagraph needs {requirement}; use executor=eager")
        self.kv_layout = KVLayout.of(self.attention_layers, self.page_size, self.dtype)

    def _size_kv_cache(self, prefill_shapes: PrefillShapes | None) -> int:
        """Pages for the KV cache: on CUDA what is left after the weights and a measured warm-up prefill, less the
        prefill graphs' share. Every rank sizes its own (its free memory); all ranks hold the same page tables,
        so the smallest."""
        cfg = self.cfg
        reserve = (lambda: self._prefill_reserve(prefill_shapes)) if prefill_shapes else None
        pages = num_pages(cfg, self.kv_layout.bytes_per_page, self.device, lambda: peak_activation_bytes(cfg, self),
                          reserve)
        return min_over_ranks(pages, self.tp_state)

    def _allocate_kv_cache(self) -> DeviceKVCache:
        cfg = self.cfg
        try:
            return DeviceKVCache(self.attention_layers, self.kv_layout, self.num_pages, self.device)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            # Sizing checked the memory available; something took it meanwhile, or a limit it cannot see.
            if not isinstance(e, torch.OutOfMemoryError) and "allocate" not in str(e):
                raise
            field = "cache.num_pages" if cfg.cache.num_pages else (
                "cache.max_memory_utilization" if self.device.type == "cuda" else "cache.kv_size_gb"
            )
            raise ValueError(
                f"{field}: the KV cache of {self.num_pages} pages ({self.num_pages * self.kv_layout.bytes_per_page} "
                f"B) could not be allocated on {self.device}; lower {field}"
            ) from None

    def _build_model(self) -> Qwen3ForCausalLM:
        arch = DEFAULT_ARCHITECTURE
        if self.checkpoint_dir is not None:
            hf_config = read_hf_config(self.checkpoint_dir)
            check_matches_checkpoint(self.cfg.model, hf_config, self.checkpoint_dir)
            arch = architecture_of(hf_config)
        model = model_class(arch)(self.cfg.model, self.dtype, self.device, tp=self.tp_state, options=self.options)
        if self.checkpoint_dir is None:
            model.init_dummy(self.cfg.seed)
            return model.eval()
        try:
            model.load_weights(iter_weights(self.checkpoint_dir, self.dtype, device=self.device))
        except TensorError as e:  # the model knows the tensor, not the file it came from
            raise CheckpointError(f"{file_of(self.checkpoint_dir, e.tensor)}: tensor {e}") from None
        return model.eval()

    def _prefill_reserve(self, shapes: PrefillShapes) -> KVReserve:
        head = self.model.lm_head
        pool = graph_pool_bytes(self, shapes.max_seqs, shapes.max_tokens)
        backend_bytes = self.backend.prefill_graph_bytes(shapes.max_seqs + 1)
        return prefill_reserve(
            shapes, pool, static_bytes(shapes, head.num_embeddings, head.weight.element_size(), backend_bytes)
        )

    def _build_graphs(self, capture: CaptureStrategy, prefill_shapes: PrefillShapes | None) -> None:
        ex = self.cfg.executor
        parts = GraphParts(self.model, self.backend, capture, self.device, self.page_size, ex.capture_sampling)
        buckets = Buckets.from_args(ex)
        self.decode_graphs = DecodeGraphs(parts, buckets, self.max_pages_per_seq, ex.staging_loop_max_rows)
        self.decode_graphs.capture(self.kv_cache.arrivals.graph_waits() if self.cfg.cache.tiers is not KVTiers.GPU
                                   else None)
        # The engine launches greedy decode steps itself (launch_decode) up to this many sequences.
        self.decode_capacity = buckets.largest if ex.capture_sampling else 0
        if prefill_shapes is not None:
            # After the decode graphs, into the same memory pool.
            self.prefill_graphs = PrefillGraphs(parts, prefill_shapes, ex.prefill_graph_head_layers)
            self.prefill_graphs.capture()

    @functools.cached_property
    def tier_agent(self) -> TierAgent | None:
        """This rank's KV tiers over its KV cache (cache.tiers), built on first use: every rank has one; rank 0's
        connector decides for all, the others apply the plan in each step (xrt/kvcache/plan.py)."""
        if self.cfg.cache.tiers is KVTiers.GPU:
            return None
        from xrt.kvstore.factory import build_agent  # the tiers (and NIXL) load only with cache.tiers set

        return build_agent(self.cfg, self.kv_cache, self.checkpoint_dir, self.tp_state)

    @functools.cached_property
    def connector(self) -> TierConnector:
        """The engine's KV tiers at tp=1: the connector over this runner's agent (a tensor-parallel rank 0 builds
        its own over the same agent, xrt.distributed.driver)."""
        agent = self.tier_agent
        if agent is None:
            return NoTierConnector()
        from xrt.kvstore.factory import build_connector

        return build_connector(self.cfg, agent)

    def close(self) -> None:
        """Close the KV tiers: the connector (which closes its agent), or this rank's agent alone (a worker)."""
        if "connector" in self.__dict__:
            self.connector.close()
        if self.__dict__.get("tier_agent") is not None:
            self.tier_agent.close()

    def _tiers_before(self, plan: TierPlan | None) -> None:
        """A step's tier plan, before its forward pass: a worker rank's agent does what rank 0 decided."""
        if plan and self.tier_agent is not None:
            self.tier_agent.apply(plan)

    def _tiers_after(self, plan: TierPlan | None) -> None:
        """Every rank, once the step's pass is queued: the plan's collectives (polls, flush)."""
        if plan and self.tier_agent is not None:
            self.tier_agent.agree(plan)

    # -- eager ------------------------------------------------------------------------------------

    def prepare(self, step: StepInput) -> tuple[torch.Tensor, AttentionMetadata]:
        return build_metadata(step, self.page_size, self.device)

    def forward_hidden(self, input_ids: torch.Tensor, meta: AttentionMetadata,
                       kv_ready: KVReady | None = None, pdl: bool = True) -> torch.Tensor:
        """The model's forward pass in this step's forward context (the backend already planned); kv_ready: per
        layer, copies into its KV pages to wait for before it attends (KVArrivals.take); pdl: whether its
        launches may use PDL (ForwardContext.pdl)."""
        with forward_context(meta, self.backend, kv_ready, pdl):
            return self.model(input_ids, meta.positions)

    def logits(self, hidden: torch.Tensor, meta: AttentionMetadata, pdl: bool = True) -> torch.Tensor:
        return self.model.compute_logits(hidden[meta.logits_indices], pdl)

    def run_model(self, input_ids: torch.Tensor, meta: AttentionMetadata,
                  kv_ready: KVReady | None = None) -> torch.Tensor:
        """Plan, forward, and logits (model dtype) for the rows in meta.logits_indices."""
        self.backend.plan(meta)
        return self.logits(self.forward_hidden(input_ids, meta, kv_ready), meta)

    def execute_eager(self, step: StepInput, loading: bool = False) -> torch.Tensor:
        """execute() without graphs: float32 logits of the chunks with needs_logits. loading: KV loads are
        pending (KVArrivals), taken after this pass's uploads and waited for layer by layer, with no PDL launch
        (ForwardContext.pdl)."""
        input_ids, meta = self.prepare(step)
        pdl = not loading
        with torch.inference_mode():
            self.backend.plan(meta)
            kv_ready = self._take_arrivals()  # after the uploads of prepare and plan: see KVArrivals
            return self.logits(self.forward_hidden(input_ids, meta, kv_ready, pdl), meta, pdl).float()

    def _take_arrivals(self) -> KVReady | None:
        """Copies still running into the KV pages (a tier's load at admission), per layer; None when none."""
        return self.kv_cache.arrivals.take()

    def _loading(self) -> bool:
        """KV loads pending for the next forward pass (queued or deferred)."""
        return self.kv_cache.arrivals.pending()

    # -- the Runner contract ----------------------------------------------------------------------

    def execute(self, step: StepInput) -> torch.Tensor:
        """float32 logits [chunks with needs_logits, vocab], in chunk order. After a replayed graph with
        argmax, `last_argmax` holds the greedy token of each returned row (computed in the graph; a view
        valid until the next forward pass), else None."""
        plan = step.tiers
        self._tiers_before(plan)
        if not step.seqs:  # a plan alone (xrt/kvcache/plan.py): no forward pass
            self._tiers_after(plan)
            return torch.empty(0, self.vocab_size, device=self.device)
        logits = self._execute(step)
        self._tiers_after(plan)
        return logits

    def _execute(self, step: StepInput) -> torch.Tensor:
        self._num_passes += 1
        step = as_decode(step)
        loading = self._loading()
        graphs = self.prefill_graphs if step.is_prefill else self.decode_graphs
        # With KV still arriving, a decode step replays the graph whose layers wait each for their own pages (or
        # runs eager, waiting the same way): a plain graph would wait for the whole load before its first layer.
        # Either way the loads are taken once the pass's own uploads are queued (KVArrivals).
        replayed = None
        if graphs is not None and not loading:
            replayed = graphs.run(step)
        elif self.decode_graphs is not None and not step.is_prefill:
            replayed = self.decode_graphs.run(step, waiting=True, before_replay=self._take_arrivals)
        if replayed is not None:
            logits, self.last_argmax = replayed
            return logits
        self.last_argmax = None
        return self.execute_eager(step, loading)

    def launch_decode(self, batch: DecodeBatch, after: PendingTokens | None) -> PendingDecode:
        """Stage the batch into the pinned inputs, replay the decode graph for its n sequences and start
        copying their greedy tokens back; returns at once. Sources r >= 0 read the tokens of `after`, which
        must be the previous forward pass (they never left the device)."""
        graphs = self.decode_graphs
        if graphs is None or not self.decode_capacity:
            raise NotImplementedError("launch_decode: this runner has decode_capacity 0; call execute()")
        n = len(batch)
        bucket = graphs.buckets.bucket_for(n)
        if bucket is None:
            raise ValueError(f"launch_decode: {n} sequences exceed the largest graph ({self.decode_capacity})")
        if after is not None and getattr(after, "seq_no", None) != self._num_passes:
            raise RuntimeError("launch_decode: `after` is not the previous forward pass; its tokens are gone")
        self._tiers_before(batch.tiers)
        kv_ready = self._take_arrivals()
        if kv_ready is not None:  # not expected (loads come with prefill steps), but never read pages mid-copy
            wait_all(kv_ready, torch.cuda.current_stream(self.device))
        pending = graphs.launch(batch, bucket, self._num_passes + 1)
        self._num_passes += 1
        self.last_argmax = None
        self._tiers_after(batch.tiers)
        return pending


def check_matches_checkpoint(args: ModelArgs, hf_config: dict, path: str) -> None:
    """A config built in code must describe the checkpoint it loads (the CLI fills it from config.json). A key
    config.json lacks is compared with transformers' default for it; a shape key it lacks is an error."""
    file = os.path.join(path, "config.json")
    check_shape_keys(file, hf_config)
    present = hf_values(ModelArgs, hf_config)
    for name, value in hf_values(ModelArgs, hf_config, defaults=True).items():
        ours = getattr(args, name)
        same = math.isclose(float(ours), float(value), rel_tol=1e-9) if isinstance(ours, float) else ours == value
        if not same:
            where = f"in {file}" if name in present else f"(transformers' default: {file} has no such key)"
            raise CheckpointError(f"model.{name}: {ours!r} does not match {value!r} {where}")
