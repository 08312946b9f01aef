"""What a kernel needs to do xrt::qk_norm_rope_store_kv's work itself (the per-head q/k RMSNorm, NeoX RoPE and this
step's KV write), as one object: the attention backend protocol names it, so it lives apart from the Triton code."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QKNormRope:
    """Per-head RMSNorm weights of q and k [D], the NeoX cos/sin cache [max_pos, D] (cos then sin), each row's
    position, the cache slot its new token goes to (-1: write nothing) and the norm's eps."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    cos_sin_cache: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    eps: float
