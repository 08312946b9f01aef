"""Self-attention over the paged KV cache. The layer writes this step's K/V into its cache
(`store_kv`) and calls whichever backend the executor put in the forward context, handing it this
step's k and v too (a backend may attend over them directly when no sequence has a cached prefix)."""

from __future__ import annotations

import torch
from torch import nn

from xrt.attention.context import get_forward_context
from xrt.layers.linear import QKVParallelLinear, RowParallelLinear
from xrt.layers.norm import RMSNorm
from xrt.layers.rotary import RotaryEmbedding


class PagedAttention(nn.Module):
    """Attention core of one layer. `kv_cache` ([num_pages, 2, page_size, num_kv_heads, head_dim])
    is bound by the executor after it allocates the cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.layer_idx = layer_idx
        self.kv_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k/v [T, KV, D] (may be strided views of a packed qkv) -> [T, H, D]."""
        ctx = get_forward_context()
        ctx.wait_kv(self.layer_idx)
        torch.ops.xrt.store_kv(k, v, self.kv_cache, ctx.meta.slot_mapping)
        return self.attend(q, k, v)

    def attend(self, q: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over the cache, which already holds this step's K/V (k and v: the same values)."""
        ctx = get_forward_context()
        ctx.wait_kv(self.layer_idx)
        return ctx.backend.forward(q, self.kv_cache, self.layer_idx, self.scale, k, v)


class QKNormSelfAttention(nn.Module):
    """qkv projection -> per-head RMSNorm of q and k + RoPE + KV write (one op, in place) -> paged
    attention -> output projection (Qwen3 style)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        rotary: RotaryEmbedding,
        layer_idx: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_kv_heads, dtype, device)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.eps = eps
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, dtype, device)
        self.q_norm = RMSNorm(head_dim, eps, dtype, device)
        self.k_norm = RMSNorm(head_dim, eps, dtype, device)
        self.rotary = rotary
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, head_dim, head_dim**-0.5, layer_idx)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.forward_qkv(positions, self.qkv_proj(hidden))

    def forward_qkv(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """The layer from an already computed qkv projection [T, (H + 2 KV) * D] (as RMSNorm.add_forward_linear
        gives it; normalised and rotated in place)."""
        t, h, kv, d = qkv.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        ctx = get_forward_context()
        attn = self.attn
        # a tier's copy into this layer's pages first: also before this step's KV write, in case a page the copy
        # fills was handed to another sequence since (preemption)
        ctx.wait_kv(attn.layer_idx)
        torch.ops.xrt.qk_norm_rope_store_kv(
            qkv, self.q_norm.weight, self.k_norm.weight, self.rotary.cos_sin_cache, positions, attn.kv_cache,
            ctx.meta.slot_mapping, h, kv, d, self.eps,
        )
        # Strided views of the packed, now normalised and rotated, qkv: no copies.
        q, k, v = qkv.view(t, h + 2 * kv, d).split((h, kv, kv), dim=1)
        out = ctx.backend.forward(q, attn.kv_cache, attn.layer_idx, attn.scale, k, v)
        return self.o_proj(out.reshape(t, h * d))
