"""What the engine needs from a model runner, declared once. The engine talks to the executor only
through this protocol (no attribute probing); `xrt.executor.runner.ModelRunner` implements it for
every executor kind, the CUDA-graph one included."""

from __future__ import annotations

from typing import Protocol

import torch

from xrt.executor.step import DecodeBatch, StepInput
from xrt.kvcache.device import DeviceKVCache


class PendingTokens(Protocol):
    """The greedy tokens of a launched decode step, on their way back to the host."""

    def tokens(self) -> list[int]:
        """The launched step's greedy token per real row; waits for the device."""
        ...


class Runner(Protocol):
    device: torch.device
    num_pages: int  # KV pages the runner allocated (the KV cache's capacity)
    page_size: int
    max_model_len: int
    vocab_size: int  # rows of the logits (token ids must be below it)
    checkpoint_dir: str | None  # where the tokenizer lives; None for dummy weights
    # The device KV tensor and its layout; read only with KV tiers (cache.tiers), which copy pages to and from it.
    kv_cache: DeviceKVCache
    # Most sequences one launch_decode takes; 0: the runner does not launch decode steps itself.
    decode_capacity: int
    # After execute(): the greedy token of each returned logits row when the runner computed it on the
    # device (CUDA-graph decode), else None. Valid until the next forward pass.
    last_argmax: torch.Tensor | None

    def execute(self, step: StepInput) -> torch.Tensor:
        """float32 logits [chunks with needs_logits, vocab], in chunk order."""
        ...

    def launch_decode(self, batch: DecodeBatch, after: PendingTokens | None) -> PendingTokens:
        """Stage and launch one greedy decode step (len(batch) <= decode_capacity) and return at once.
        `after`: the previous launch, whose device-side tokens rows with sources >= 0 read."""
        ...
