"""The memory-bandwidth floor of a decode step: every weight and every cached KV byte of the batch
has to be read once, so no step can beat (weight bytes + KV bytes) / copy bandwidth."""

from __future__ import annotations

import statistics

import torch

from xrt.bench.clock import StepClock
from xrt.config import ModelArgs


def decode_weight_bytes(m: ModelArgs, elem_bytes: int) -> int:
    """Bytes of weights one decode step reads. The embedding lookup touches only a few rows, so only
    the lm_head matrix is counted once, whether or not it is tied to the embedding."""
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    layer = (
        m.hidden_size * (q + 2 * kv)  # qkv_proj
        + q * m.hidden_size  # o_proj
        + m.hidden_size * 2 * m.intermediate_size  # gate_up_proj
        + m.intermediate_size * m.hidden_size  # down_proj
        + 2 * m.hidden_size  # input and post-attention norms
        + 2 * m.head_dim  # q_norm, k_norm
    )
    params = m.num_hidden_layers * layer + m.hidden_size + m.vocab_size * m.hidden_size
    return params * elem_bytes


def decode_kv_bytes(m: ModelArgs, batch: int, context: float, elem_bytes: int) -> float:
    """KV bytes a decode step reads for `batch` sequences of `context` cached tokens each."""
    per_token = m.num_hidden_layers * 2 * m.num_key_value_heads * m.head_dim * elem_bytes
    return batch * context * per_token


def copy_bandwidth(device: torch.device, nbytes: int, reps: int = 10) -> float:
    """Device copy bandwidth in bytes/s, counting the read and the write (median of `reps`)."""
    src = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    clock = StepClock(device)
    clock.start()
    for _ in range(reps):
        dst.copy_(src)
        clock.mark()
    clock.stop()
    seconds = statistics.median(clock.steps_ms()) / 1e3
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the engine sizes its KV cache from free memory
    return 2 * nbytes / seconds


def default_copy_bytes(device: torch.device) -> int:
    """Large enough to defeat caches: 1 GiB on a GPU (L2 is tens of MB), 256 MiB on a CPU."""
    return (1 << 30) if device.type == "cuda" else (256 << 20)
