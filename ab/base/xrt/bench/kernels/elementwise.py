"""The elementwise Triton kernels against their torch references (xrt.ops.reference) at the model's widths,
for `bench.kernel_tokens` tokens. Launched from Python (do_bench), as the eager prefill launches them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from xrt.bench.kernels.timing import Launch, Measurement, measure, rel_err
from xrt.config import XrtConfig
from xrt.config.bench import KernelGroup

GROUP = KernelGroup.ELEMENTWISE.value


def rope_cache(head_dim: int, theta: float, max_pos: int, device: torch.device) -> torch.Tensor:
    """cos_sin_cache[pos] = cat(cos(pos * inv_freq), sin(pos * inv_freq)), float32 (the layers' layout)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64, device=device), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


Case = tuple[str, Launch, Launch, int, Callable[[], float] | None]


def cases(cfg: XrtConfig, n: int, dtype: torch.dtype, device: torch.device) -> list[Case]:
    """(name, Triton call, reference call, bytes one call moves, check) at n tokens on fresh random inputs.
    check: the relative error of the kernel's result (functional kernels; the in-place ones are checked by
    tests/kernels/test_kernels_gpu.py)."""
    from xrt.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_store_kv
    from xrt.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from xrt.kernels.silu_and_mul import silu_and_mul
    from xrt.kernels.store_kv import store_kv
    from xrt.ops import reference

    m, page, elem = cfg.model, cfg.cache.page_size, dtype.itemsize
    hidden, inter, heads, kv_heads, d, eps = (m.hidden_size, m.intermediate_size, m.num_attention_heads,
                                              m.num_key_value_heads, m.head_dim, m.rms_norm_eps)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device).to(dtype)

    x, res, w = rand(n, hidden), rand(n, hidden), rand(hidden)
    gate_up = rand(n, 2 * inter)
    qkv, q_w, k_w = rand(n, (heads + 2 * kv_heads) * d), rand(d), rand(d)
    max_pos = min(m.max_position_embeddings, 1 << 16)
    cos_sin = rope_cache(d, m.rope_theta, max_pos, device)
    positions = torch.randint(0, max_pos, (n,), device=device)
    num_pages = -(-n // page) + 1
    cache = rand(num_pages, 2, page, kv_heads, d)
    slots = torch.randperm(num_pages * page, device=device)[:n]
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(n, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(n, kv_heads, d)
    rope_args = (q_w, k_w, cos_sin, positions)
    dims = (heads, kv_heads, d, eps)
    qk_bytes = 2 * n * (heads + kv_heads) * d * elem
    kv_bytes = 4 * n * kv_heads * d * elem

    def unfused_triton() -> None:
        qk_norm_rope(qkv, *rope_args, *dims)
        store_kv(k, v, cache, slots)

    def unfused_torch() -> None:
        reference.qk_norm_rope(qkv, *rope_args, *dims)
        reference.store_kv(k, v, cache, slots)

    return [
        ("rms_norm", lambda: rms_norm(x, w, eps), lambda: reference.rms_norm(x, w, eps), 2 * n * hidden * elem,
         lambda: rel_err(rms_norm(x, w, eps), reference.rms_norm(x, w, eps))),
        ("fused_add_rms_norm", lambda: fused_add_rms_norm(x, res, w, eps),
         lambda: reference.fused_add_rms_norm(x, res, w, eps), 4 * n * hidden * elem, None),
        ("silu_and_mul", lambda: silu_and_mul(gate_up), lambda: reference.silu_and_mul(gate_up),
         3 * n * inter * elem, lambda: rel_err(silu_and_mul(gate_up), reference.silu_and_mul(gate_up))),
        ("qk_norm_rope", lambda: qk_norm_rope(qkv, *rope_args, *dims),
         lambda: reference.qk_norm_rope(qkv, *rope_args, *dims), qk_bytes, None),
        ("store_kv", lambda: store_kv(k, v, cache, slots), lambda: reference.store_kv(k, v, cache, slots),
         kv_bytes, None),
        ("qk_norm_rope + store_kv (2 launches)", unfused_triton, unfused_torch, qk_bytes + kv_bytes, None),
        ("qk_norm_rope_store_kv (fused)", lambda: qk_norm_rope_store_kv(qkv, *rope_args, cache, slots, *dims),
         unfused_torch, qk_bytes + kv_bytes, None),
    ]


def run(cfg: XrtConfig, dtype: torch.dtype, device: torch.device) -> Iterator[Measurement]:
    for n in cfg.bench.kernel_tokens:
        for name, fast, ref, nbytes, check in cases(cfg, n, dtype, device):
            yield measure(Measurement(GROUP, name, n, None, "torch", "baseline", nbytes=nbytes), ref, graph=False)
            yield measure(Measurement(GROUP, name, n, None, "triton", "default", nbytes=nbytes), fast, check=check,
                          graph=False)
