"""Qwen3 dense decoder (Qwen3ForCausalLM) over xrt's layers: paged attention with per-head
q/k RMSNorm, gated MLP, optional tied LM head. Weight names follow the HF checkpoint."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch
from torch import nn

from xrt.attention.context import in_prefill
from xrt.config import ModelArgs
from xrt.layers.attention import QKNormSelfAttention
from xrt.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from xrt.layers.mlp import GatedMLP
from xrt.layers.norm import RMSNorm
from xrt.layers.options import DEFAULT_OPTIONS, LayerOptions
from xrt.layers.rotary import RotaryEmbedding
from xrt.layers.weights import WeightShapeError, default_weight_loader
from xrt.models.errors import TensorError
from xrt.ops.parallel_state import SINGLE, TPState

# Checkpoint tensors with no parameter here that are safe to skip (recomputed, not learned).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class Qwen3DecoderLayer(nn.Module):
    def __init__(
        self, args: ModelArgs, rotary: RotaryEmbedding, layer_idx: int, dtype: torch.dtype, device: torch.device,
        tp: TPState = SINGLE, options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__()
        self.self_attn = QKNormSelfAttention(
            args.hidden_size,
            args.num_attention_heads,
            args.num_key_value_heads,
            args.head_dim,
            args.rms_norm_eps,
            rotary,
            layer_idx,
            dtype,
            device,
            tp,
            options,
        )
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size, dtype, device, tp, options)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype, device, options)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype, device, options)
        self.fuse_prefill_norms = options.fuse_prefill_norms
        self.skinny_rows = options.skinny_rows

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (mlp output, residual stream before it); the next layer's norm adds them. With
        `executor.fuse_prefill_norms` a prefill pass of more rows than the skinny GEMM's returns (residual stream
        after the layer, None) instead: each residual add is the epilogue of the projection before it, each norm
        the prologue of the GEMM after it, and the next layer (or the final norm) takes the stream as layer 0
        takes the embeddings. The sublayers' forward is called directly: nothing hooks them, and
        nn.Module.__call__ costs host time on every step."""
        if self.fuse_prefill_norms and residual is None and hidden.shape[0] > self.skinny_rows and in_prefill():
            stream = self.self_attn.forward_fused(positions, hidden, self.input_layernorm)
            return self.mlp.forward_fused(stream, self.post_attention_layernorm), None
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_forward(hidden, residual)
        hidden = self.self_attn.forward(positions, hidden)
        hidden, residual = self.post_attention_layernorm.add_forward(hidden, residual)
        return self.mlp.forward(hidden), residual


class Qwen3Model(nn.Module):
    def __init__(
        self, args: ModelArgs, dtype: torch.dtype, device: torch.device, tp: TPState = SINGLE,
        options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size, dtype, device, tp)
        self.rotary_emb = RotaryEmbedding(args.head_dim, args.max_position_embeddings, args.rope_theta, device)
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(args, self.rotary_emb, i, dtype, device, tp, options)
            for i in range(args.num_hidden_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, dtype, device, options)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.run_layers(positions, self.embed_tokens(input_ids), None, 0, len(self.layers))
        return self.final_norm(hidden, residual)

    def run_layers(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, start: int,
                   end: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Layers [start, end) over (layer output, residual stream before it); residual None before layer 0 (and
        between layers that fused their norms: `Qwen3DecoderLayer.forward`)."""
        for layer in itertools.islice(self.layers, start, end):
            hidden, residual = layer(positions, hidden, residual)
        return hidden, residual

    def final_norm(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if residual is None:
            return self.norm(hidden)
        hidden, _ = self.norm.add_forward(hidden, residual)
        return hidden


class Qwen3ForCausalLM(nn.Module):
    # HF projection name -> (our fused module, shard id passed to its weight_loader)
    packed_modules_mapping: dict[str, tuple[str, str | int]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(
        self, args: ModelArgs, dtype: torch.dtype, device: torch.device | str, tp: TPState = SINGLE,
        options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        """tp: this rank's shard (one rank by default); options: what the layers take from cfg.executor."""
        super().__init__()
        device = torch.device(device)
        self.args = args
        self.dtype = dtype
        self.model = Qwen3Model(args, dtype, device, tp, options)
        self.lm_head = ParallelLMHead(args.vocab_size, args.hidden_size, dtype, device, tp, options)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def forward_head(self, input_ids: torch.Tensor, positions: torch.Tensor, num_layers: int
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The forward pass split in two (a prefill graph's head, `xrt.executor.graphs.prefill`): the embedding
        and the first num_layers layers; forward_tail(positions, *forward_head(ids, positions, n), n) == forward."""
        return self.model.run_layers(positions, self.model.embed_tokens(input_ids), None, 0, num_layers)

    def forward_tail(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                     first_layer: int) -> torch.Tensor:
        """The layers from first_layer on and the final norm."""
        model = self.model
        return model.final_norm(*model.run_layers(positions, hidden, residual, first_layer, len(model.layers)))

    def compute_logits(self, hidden: torch.Tensor, pdl: bool = True) -> torch.Tensor:
        """Logits of `hidden`'s rows; pdl: the forward pass's ForwardContext.pdl (this runs outside it)."""
        return self.lm_head.compute_logits(hidden, pdl)

    def checkpoint_names(self) -> dict[str, tuple[str, str | int | None]]:
        """Every HF tensor name this model needs -> (our parameter name, shard id or None), in model order."""
        out: dict[str, tuple[str, str | int | None]] = {}
        for pname, _ in self.named_parameters():
            module_path, _, leaf = pname.rpartition(".")
            parent, _, module = module_path.rpartition(".")
            packed = [(hf, shard) for hf, (ours, shard) in self.packed_modules_mapping.items() if ours == module]
            if not packed:
                out[pname] = (pname, None)
            for hf, shard in packed:
                out[f"{parent}.{hf}.{leaf}"] = (pname, shard)
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the parameters (fusing q/k/v and gate/up, slicing for the TP rank).
        Every parameter must be covered; unknown tensors are errors unless known to be harmless."""
        params = dict(self.named_parameters())
        targets = self.checkpoint_names()
        loaded: set[str] = set()
        for name, tensor in weights:
            target = targets.get(name)
            if target is None:
                if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and self.args.tie_word_embeddings):
                    continue
                raise TensorError(name, f"unexpected tensor in checkpoint (no such parameter in {type(self).__name__})")
            pname, shard = target
            param = params[pname]
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                if shard is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard)
            except WeightShapeError as e:
                raise TensorError(name, str(e)) from None
            loaded.add(name)
        missing = [name for name in targets if name not in loaded]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise TensorError(missing[0], f"missing from checkpoint{more}")

    def init_dummy(self, seed: int) -> None:
        """Random weights for load_format=dummy: normal(0, 0.02), RMSNorm weights 1."""
        norms = {id(m.weight) for m in self.modules() if isinstance(m, RMSNorm)}
        for name, param in sorted(self.named_parameters()):
            if id(param) in norms:
                param.data.fill_(1.0)
                continue
            # Wrapped: manual_seed takes a uint64, and the config's seed may be its largest value.
            gen = torch.Generator(device=param.device).manual_seed((seed + _stable_hash(name)) % 2**64)
            param.data.normal_(0.0, 0.02, generator=gen)


def _stable_hash(name: str) -> int:
    # Python's hash() is salted per process; dummy weights must be the same every run.
    h = 0
    for ch in name.encode():
        h = (h * 131 + ch) % 1_000_003
    return h
