"""The eager model runner: builds the model on its device, loads weights (or dummy ones),
allocates the paged KV cache, picks the attention backend, and runs one step at a time.
The CUDA-graph runner subclasses it and reuses prepare / plan / forward_hidden / logits."""

from __future__ import annotations

import importlib.util
import math
import sys

import torch

from xrt.attention.backend import AttentionBackend
from xrt.attention.context import forward_context
from xrt.attention.metadata import AttentionMetadata
from xrt.attention.torch_ref import TorchRefBackend
from xrt.config import ModelArgs, XrtConfig
from xrt.executor.device import resolve_device, resolve_dtype
from xrt.executor.interface import PendingTokens
from xrt.executor.options import apply_options
from xrt.executor.prepare import build_metadata
from xrt.executor.step import DecodeBatch, StepInput
from xrt.layers.attention import PagedAttention
from xrt.models.checkpoint import resolve_checkpoint
from xrt.models.loader import CheckpointError, iter_weights, read_hf_config
from xrt.models.qwen3 import Qwen3ForCausalLM
from xrt.models.registry import DEFAULT_ARCHITECTURE, architecture_of, model_class
from xrt.ops.parallel_state import init_tp
from xrt.reflect import hf_values

GB = 1e9


class ModelRunner:
    def __init__(self, cfg: XrtConfig) -> None:
        # torch.library custom ops import torch._dynamo (seconds) on their first call; pay that at
        # startup rather than in the first request's time to first token.
        import torch._dynamo  # noqa: F401

        self.cfg = cfg
        apply_options(cfg)
        init_tp(cfg.parallel.tp)
        self.device = resolve_device(cfg)
        self.dtype = resolve_dtype(cfg, self.device)
        self.page_size = cfg.cache.page_size
        self.max_model_len = cfg.model.max_model_len
        self.checkpoint_dir = resolve_checkpoint(cfg.model)
        self.model = self._build_model()
        self.vocab_size = cfg.model.vocab_size
        # The eager runner computes no tokens on the device and launches no decode steps itself.
        self.decode_capacity = 0
        self.last_argmax: torch.Tensor | None = None
        self.attention_layers = sorted(
            (m for m in self.model.modules() if isinstance(m, PagedAttention)), key=lambda m: m.layer_idx
        )
        # Before sizing: on CUDA the KV budget is measured by running a prefill, which needs the backend.
        self.backend = self._make_backend()
        self.num_pages = self._num_pages()
        self.kv_cache = self._allocate_kv_cache()

    def _build_model(self) -> Qwen3ForCausalLM:
        arch = DEFAULT_ARCHITECTURE
        if self.checkpoint_dir is not None:
            hf_config = read_hf_config(self.checkpoint_dir)
            check_matches_checkpoint(self.cfg.model, hf_config, self.checkpoint_dir)
            arch = architecture_of(hf_config)
        model = model_class(arch)(self.cfg.model, self.dtype, self.device)
        if self.checkpoint_dir is None:
            model.init_dummy(self.cfg.seed)
        else:
            model.load_weights(iter_weights(self.checkpoint_dir, self.dtype))
        return model.eval()

    @property
    def bytes_per_page(self) -> int:
        first = self.attention_layers[0]
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return len(self.attention_layers) * 2 * self.page_size * first.num_kv_heads * first.head_dim * elem

    def _num_pages(self) -> int:
        cache = self.cfg.cache
        if cache.num_pages:
            return cache.num_pages
        if self.device.type == "cuda" and importlib.util.find_spec("xrt.kvcache.sizing") is not None:
            from xrt.kvcache.sizing import cuda_num_pages

            pages = cuda_num_pages(self.cfg, self, self.bytes_per_page)
        else:
            pages = math.floor(cache.kv_size_gb * GB / self.bytes_per_page)
        if pages < 1:
            raise ValueError(
                f"cache.kv_size_gb: {cache.kv_size_gb} GB holds no {self.bytes_per_page}-byte KV page; "
                f"raise it or set cache.num_pages"
            )
        return pages

    def _allocate_kv_cache(self) -> torch.Tensor:
        """One tensor [layers, num_pages, 2, page_size, kv_heads, head_dim]; layer i's attention
        gets the view kv_cache[i] in the FlashInfer NHD layout."""
        first = self.attention_layers[0]
        shape = (len(self.attention_layers), self.num_pages, 2, self.page_size, first.num_kv_heads, first.head_dim)
        kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        for layer in self.attention_layers:
            layer.kv_cache = kv_cache[layer.layer_idx]
        return kv_cache

    def _make_backend(self) -> AttentionBackend:
        if self.device.type != "cuda":
            return TorchRefBackend()
        first = self.attention_layers[0]
        try:
            from xrt.attention.flashinfer import FlashInferBackend

            return FlashInferBackend(
                first.num_heads,
                first.num_kv_heads,
                first.head_dim,
                self.page_size,
                self.dtype,
                self.device,
                self.cfg.executor.workspace_mb,
                # A prefill without cached prefixes attends over this step's k/v, not the pages.
                ragged_prefill=True,
                # The longest sequence: max_model_len tokens plus the one generated at the limit.
                max_pages_per_seq=-(-(self.max_model_len + 1) // self.page_size),
            )
        except ImportError as e:  # also FlashInferUnavailable: no flashinfer, or a dtype/head_dim it lacks
            print(f"[xrt] attention: torch reference backend ({e})", file=sys.stderr, flush=True)
            return TorchRefBackend()

    def prepare(self, step: StepInput) -> tuple[torch.Tensor, AttentionMetadata]:
        return build_metadata(step, self.page_size, self.device)

    def forward_hidden(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The model's forward pass in this step's forward context (the backend already planned)."""
        with forward_context(meta, self.backend):
            return self.model(input_ids, meta.positions)

    def logits(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model.compute_logits(hidden[meta.logits_indices])

    def run_model(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Plan, forward, and logits (model dtype) for the rows in meta.logits_indices."""
        self.backend.plan(meta)
        return self.logits(self.forward_hidden(input_ids, meta), meta)

    def launch_decode(self, batch: DecodeBatch, after: PendingTokens | None) -> PendingTokens:
        raise NotImplementedError("launch_decode: this runner has decode_capacity 0 (eager); call execute()")

    def execute(self, step: StepInput) -> torch.Tensor:
        """float32 logits [chunks with needs_logits, vocab], in chunk order."""
        input_ids, meta = self.prepare(step)
        with torch.inference_mode():
            return self.run_model(input_ids, meta).float()


def check_matches_checkpoint(args: ModelArgs, hf_config: dict, path: str) -> None:
    """A config built in code must describe the checkpoint it loads (the CLI fills it from config.json)."""
    for name, value in hf_values(ModelArgs, hf_config).items():
        ours = getattr(args, name)
        same = math.isclose(float(ours), float(value), rel_tol=1e-9) if isinstance(ours, float) else ours == value
        if not same:
            raise CheckpointError(f"model.{name}: {ours!r} does not match {value!r} in {path}/config.json")
