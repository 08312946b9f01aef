"""The peer: HF transformers Qwen3ForCausalLM with the same shape and dtype, timed with the same
protocol (TTFT = forward of the batch prompt, TPOT = mean decode step). As it comes (`bench.peer=hf`) it decodes
on a DynamicCache; compiled (`bench.peer=compile`) its decode step runs under torch.compile (mode reduce-overhead:
CUDA graphs on CUDA) on a StaticCache kept per batch size, the prompt's forward eager, as transformers' own
compiled generate does. With a checkpoint it loads the same weights; with dummy weights it gets its own seeded
random ones (the values do not change the time of a step)."""

from __future__ import annotations

import gc
import inspect
from typing import Any

import attrs
import torch

from xrt.bench.clock import StepClock
from xrt.bench.engine_timing import RunTiming, split_steps
from xrt.config import LoadFormat, ModelArgs, XrtConfig
from xrt.reflect import hf_key_of


def hf_config_dict(m: ModelArgs) -> dict[str, object]:
    """config.json keys of the model's shape, derived from the schema's hf metadata."""
    return {key: getattr(m, a.name) for a in attrs.fields(ModelArgs) if (key := hf_key_of(a))}


class HfPeer:
    def __init__(self, cfg: XrtConfig, device: torch.device, dtype: torch.dtype, compiled: bool = False) -> None:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        ckpt = None
        if cfg.model.load_format is not LoadFormat.DUMMY:
            from xrt.models.checkpoint import resolve_checkpoint

            ckpt = resolve_checkpoint(cfg.model)
        if ckpt:
            model = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="sdpa")
            self.weights = "checkpoint"
        else:
            config = Qwen3Config(**hf_config_dict(cfg.model), attn_implementation="sdpa")
            torch.manual_seed(cfg.seed)
            with torch.device(device):
                model = Qwen3ForCausalLM(config)
            self.weights = "random"
        self.model = model.to(device=device, dtype=dtype).eval()
        self.device = device
        params = inspect.signature(self.model.forward).parameters
        # transformers renamed past_key_values to cache; accept either release.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.compiled = compiled
        self.last_tokens: torch.Tensor | None = None  # the greedy tokens of the last timed batch (batch, output_len)
        if compiled:
            mode = "reduce-overhead" if device.type == "cuda" else "default"
            self._step = torch.compile(self._position_forward, mode=mode, fullgraph=True)
            # StaticCache per batch size, of the protocol's whole length: its tensors keep their addresses (the
            # CUDA graphs of the compiled step read them in place) across the warm-up and the timed runs.
            self._static: dict[int, tuple[Any, int]] = {}
            self._length = cfg.bench.input_len + cfg.bench.output_len

    def _forward(self, ids: torch.Tensor, cache: object) -> torch.Tensor:
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def _position_forward(self, ids: torch.Tensor, cache: object, positions: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1,
                         **{self._cache_kw: cache})
        return out.logits[:, -1].argmax(-1, keepdim=True)

    def _static_cache(self, batch: int, length: int) -> object:
        """The batch size's StaticCache, emptied; a new one when it is too short."""
        from transformers import StaticCache

        cache, room = self._static.get(batch, (None, 0))
        if cache is None or room < length:
            room = max(length, self._length)
            cache = StaticCache(config=self.model.config, max_cache_len=room)
            self._static[batch] = (cache, room)
        else:
            cache.reset()
        return cache

    def _compiled_step(self, tok: torch.Tensor, cache: object, position: int) -> torch.Tensor:
        positions = torch.full((tok.shape[0], 1), position, dtype=torch.long, device=self.device)
        # A new step for CUDA graph trees: the last step's output (fed back in) is not overwritten under us.
        torch.compiler.cudagraph_mark_step_begin()
        return self._step(tok, cache, positions).clone()

    @torch.inference_mode()
    def time_batch(self, clock: StepClock, prompts: list[list[int]], output_len: int) -> RunTiming:
        from transformers import DynamicCache

        ids = torch.tensor(prompts, dtype=torch.long, device=self.device)
        batch, length = ids.shape
        if self.compiled:
            cache = self._static_cache(batch, length + output_len)
        else:
            cache = DynamicCache(config=self.model.config)
        clock.start()
        tok = self._forward(ids, cache)  # the prompt: eager either way
        clock.mark()
        tokens = [tok]
        for i in range(output_len - 1):
            tok = self._compiled_step(tok, cache, length + i) if self.compiled else self._forward(tok, cache)
            clock.mark()
            tokens.append(tok)
        clock.stop()
        self.last_tokens = torch.cat(tokens, 1)
        return split_steps(clock.steps_ms(), clock.wall_ms(), output_len)

    def close(self) -> None:
        """Give the memory back before the engine sizes its KV cache from what is free."""
        del self.model
        if self.compiled:
            del self._step, self._static
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
