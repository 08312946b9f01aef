"""Compile every kernel for one model shape before CUDA graph capture.

Triton compiles on the first launch of each specialization (constexprs, and integer arguments equal to 1
or divisible by 16). Every integer the wrappers pass is a model dimension or a stride fixed by the model
shape, never the token count, so one launch per kernel at any token count covers all batch sizes; the
executor calls this (or runs one eager step per bucket) before capturing."""

from __future__ import annotations

import torch

from xrt.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv
from xrt.kernels.rms_norm import fused_add_rms_norm, rms_norm
from xrt.kernels.silu_and_mul import silu_and_mul
from xrt.kernels.store_kv import store_kv


def warmup_kernels(
    hidden_size: int,
    intermediate_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    cache_dtype: torch.dtype | None = None,
    eps: float = 1e-6,
) -> None:
    """Launch each kernel once on scratch tensors shaped like the model's (2 tokens, 2 pages)."""
    n_tokens = 2
    kw = {"dtype": dtype, "device": device}
    x = torch.randn(n_tokens, hidden_size, **kw)
    residual = torch.randn(n_tokens, hidden_size, **kw)
    norm_w = torch.ones(hidden_size, **kw)
    rms_norm(x, norm_w, eps)
    fused_add_rms_norm(x, residual, norm_w, eps)
    silu_and_mul(torch.randn(n_tokens, 2 * intermediate_size, **kw))

    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(n_tokens, q_size + 2 * kv_size, **kw)
    head_w = torch.ones(head_dim, **kw)
    cos_sin = torch.zeros(n_tokens, head_dim, dtype=torch.float32, device=device)
    positions = torch.arange(n_tokens, dtype=torch.int64, device=device)
    kv_cache = torch.zeros(2, 2, page_size, num_kv_heads, head_dim, dtype=cache_dtype or dtype, device=device)
    slots = torch.tensor([0, -1], dtype=torch.int64, device=device)
    qk_norm_rope(qkv, head_w, head_w, cos_sin, positions, num_heads, num_kv_heads, head_dim, eps)
    qk_norm_rope_store_kv(qkv, head_w, head_w, cos_sin, positions, kv_cache, slots,
                          num_heads, num_kv_heads, head_dim, eps)
    k = qkv[:, q_size:q_size + kv_size].view(n_tokens, num_kv_heads, head_dim)
    v = qkv[:, q_size + kv_size:].view(n_tokens, num_kv_heads, head_dim)
    store_kv(k, v, kv_cache, slots)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
