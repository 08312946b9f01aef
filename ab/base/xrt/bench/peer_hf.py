"""The peer: HF transformers Qwen3ForCausalLM with the same shape and dtype, timed with the same
protocol (TTFT = forward of the batch prompt, TPOT = mean decode step on its DynamicCache). With a
checkpoint it loads the same weights; with dummy weights it gets its own seeded random ones (the
values do not change the time of a step)."""

from __future__ import annotations

import gc
import inspect

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
    def __init__(self, cfg: XrtConfig, device: torch.device, dtype: torch.dtype) -> None:
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

    def _forward(self, ids: torch.Tensor, cache: object) -> torch.Tensor:
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache})
        return out.logits[:, -1].argmax(-1, keepdim=True)

    @torch.inference_mode()
    def time_batch(self, clock: StepClock, prompts: list[list[int]], output_len: int) -> RunTiming:
        from transformers import DynamicCache

        ids = torch.tensor(prompts, dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.model.config)
        clock.start()
        tok = self._forward(ids, cache)
        clock.mark()
        for _ in range(output_len - 1):
            tok = self._forward(tok, cache)
            clock.mark()
        clock.stop()
        return split_steps(clock.steps_ms(), clock.wall_ms(), output_len)

    def close(self) -> None:
        """Give the memory back before the engine sizes its KV cache from what is free."""
        del self.model
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
