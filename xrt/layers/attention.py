"""Self-attention over the paged KV cache. The layer writes this step's K/V into its cache (with the q/k norm and
RoPE: `qk_norm_rope_store_kv`) and calls whichever backend the executor put in the forward context, handing it
this step's k and v too (a backend may attend over them directly when no sequence has a cached prefix)."""

from __future__ import annotations

import torch
from torch import nn

from xrt.attention.context import get_forward_context
from xrt.kernels.qk_norm_rope_args import QKNormRope
from xrt.layers.linear import QKVParallelLinear, RowParallelLinear
from xrt.layers.norm import RMSNorm
from xrt.layers.options import DEFAULT_OPTIONS, LayerOptions
from xrt.layers.rotary import RotaryEmbedding
from xrt.ops.parallel_state import SINGLE, TPState


class PagedAttention(nn.Module):
    """What one layer's attention keeps for the executor: its shape, softmax scale and index, and `kv_cache`
    ([num_pages, 2, page_size, num_kv_heads, head_dim]), bound by the executor after it allocates the cache
    (`xrt.kvcache.device.DeviceKVCache`). QKNormSelfAttention writes the cache and calls the backend over it."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.layer_idx = layer_idx
        self.kv_cache = torch.empty(0)


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
        tp: TPState = SINGLE,
        options: LayerOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_kv_heads, dtype, device, tp, options)
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.eps = eps
        self.pdl_max_rows = options.pdl_max_rows
        self.fuse_qkv_epilogue = options.fuse_qkv_epilogue
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, dtype, device, tp, options)
        # Their weights only: qk_norm_rope_store_kv normalises q and k.
        self.q_norm = RMSNorm(head_dim, eps, dtype, device, options)
        self.k_norm = RMSNorm(head_dim, eps, dtype, device, options)
        self.rotary = rotary
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, head_dim, head_dim**-0.5, layer_idx)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self._attend(positions, hidden, None))

    def forward_fused(self, positions: torch.Tensor, stream: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """stream + forward(positions, norm(stream)) for prefill rows (`executor.fuse_prefill_norms`, which needs
        `executor.fuse_qkv_epilogue`): the norm as the qkv GEMM's prologue, the residual add as o_proj's epilogue
        (on CPU the ops' references: the same values as the unfused layer)."""
        return self.o_proj.forward_add(self._attend(positions, stream, norm), stream)

    def _attend(self, positions: torch.Tensor, hidden: torch.Tensor, norm: RMSNorm | None) -> torch.Tensor:
        """The attention's output [T, H * D] before o_proj; norm: the layer's input norm, still to apply to
        hidden."""
        t, h, kv, d = hidden.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        ctx = get_forward_context()
        attn = self.attn
        pdl = t <= self.pdl_max_rows and ctx.pdl  # as `uses_pdl`, with the context at hand
        if (self.fuse_qkv_epilogue and ctx.meta.is_prefill and t > self.qkv_proj.skinny_rows
                and not ctx.backend.fuses_qk_norm_rope()):
            # One GEMM writes the normalised, rotated qkv and this step's K/V (executor.fuse_qkv_epilogue; on CPU
            # the op's reference runs the same ops as below), so a tier's copy into this layer's pages must be in
            # before the GEMM starts. The input norm, if still due, is its prologue. Prefill passes only: a decode
            # batch of ~100 rows would leave the GEMM's 128-token tiles a few dozen programs.
            ctx.wait_kv(attn.layer_idx)
            qkv = torch.ops.xrt.linear_qk_norm_rope_store_kv(
                hidden, self.qkv_proj.weight, self.q_norm.weight, self.k_norm.weight, self.rotary.cos_sin_cache,
                positions, attn.kv_cache, ctx.meta.slot_mapping, h, kv, d, self.eps,
                None if norm is None else norm.weight,
            )
        else:
            if norm is not None:
                hidden = norm.forward(hidden)
            # [T, (H + 2 KV) * D]: normalised and rotated in place below, or by the attention kernel where it fuses
            # that
            qkv = self.qkv_proj(hidden)
            # a tier's copy into this layer's pages first: also before this step's KV write, in case a page the
            # copy fills was handed to another sequence since (preemption)
            ctx.wait_kv(attn.layer_idx)
            if ctx.backend.fuses_qk_norm_rope():
                # The attention kernel normalises, rotates and writes this step's K/V itself
                # (executor.fuse_qk_norm_rope).
                rope = QKNormRope(self.q_norm.weight, self.k_norm.weight, self.rotary.cos_sin_cache, positions,
                                  ctx.meta.slot_mapping, self.eps)
                out = ctx.backend.forward_fused(qkv, rope, attn.kv_cache, attn.layer_idx, attn.scale, pdl=pdl)
                return out.reshape(t, h * d)
            torch.ops.xrt.qk_norm_rope_store_kv(
                qkv, self.q_norm.weight, self.k_norm.weight, self.rotary.cos_sin_cache, positions, attn.kv_cache,
                ctx.meta.slot_mapping, h, kv, d, self.eps, pdl,
            )
        # Strided views of the packed, now normalised and rotated, qkv: no copies.
        q, k, v = qkv.view(t, h + 2 * kv, d).split((h, kv, kv), dim=1)
        out = ctx.backend.forward(q, attn.kv_cache, attn.layer_idx, attn.scale, k, v, pdl=pdl)
        return out.reshape(t, h * d)
