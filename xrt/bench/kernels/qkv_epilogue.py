"""The prefill's qkv projection with its q/k norm, RoPE and KV write: cuBLAS then xrt::qk_norm_rope_store_kv
(what the layers run with `executor.fuse_qkv_epilogue` off) against xrt.kernels.qkv_gemm (one GEMM, the rest in
its epilogue) and a few tilings of it, at `bench.kernel_tokens` tokens of the model's shape; the cuBLAS GEMM alone
as a line of its own, the floor the epilogue adds to. Replayed from a CUDA graph (launch overhead out, as in the
prefill graphs); every fused variant is checked against the unfused output first."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from xrt.bench.kernels.elementwise import rope_cache
from xrt.bench.kernels.timing import Measurement, measure, rel_err
from xrt.config import XrtConfig
from xrt.config.bench import KernelGroup

GROUP = KernelGroup.QKV_EPILOGUE.value
# Tilings beside the kernel's defaults (xrt.kernels.qkv_gemm: 128 tokens, K step 64, 8 warps, 3 stages, one dot).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "dot per half": {"one_dot": False},
    "stages4": {"num_stages": 4},
    "bk128 stages2": {"block_k": 128, "num_stages": 2},
    "bm64 warps4": {"block_m": 64, "num_warps": 4},
    "bm64 warps4 stages4": {"block_m": 64, "num_warps": 4, "num_stages": 4},
    "warps4": {"num_warps": 4},
}


def run(cfg: XrtConfig, dtype: torch.dtype, device: torch.device) -> Iterator[Measurement]:
    from xrt.kernels.qk_norm_rope import qk_norm_rope_store_kv
    from xrt.kernels.qkv_gemm import linear_qk_norm_rope_store_kv, supports

    m, page = cfg.model, cfg.cache.page_size
    heads, kv_heads, d, hidden, eps = (m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.hidden_size,
                                       m.rms_norm_eps)
    width = (heads + 2 * kv_heads) * d
    w = torch.randn(width, hidden, device=device).mul_(hidden**-0.5).to(dtype)
    q_w, k_w = (torch.randn(d, device=device) * 0.5 + 1).to(dtype), (torch.randn(d, device=device) * 0.5 + 1).to(dtype)
    max_pos = min(m.max_position_embeddings, 1 << 16)
    cos_sin = rope_cache(d, m.rope_theta, max_pos, device)
    for n in cfg.bench.kernel_tokens:
        x = torch.randn(n, hidden, device=device).to(dtype)
        positions = torch.randint(0, max_pos, (n,), device=device)
        num_pages = -(-n // page) + 1
        cache = torch.zeros(num_pages, 2, page, kv_heads, d, device=device, dtype=dtype)
        slots = torch.randperm(num_pages * page, device=device)[:n]
        args = (q_w, k_w, cos_sin, positions, cache, slots, heads, kv_heads, d, eps)
        # x and the weight in, qkv out, k and v into the cache
        nbytes = (n * hidden + width * hidden + n * width + 2 * n * kv_heads * d) * dtype.itemsize

        def unfused(x: torch.Tensor = x, args: tuple = args) -> torch.Tensor:
            qkv = torch.mm(x, w.t())
            qk_norm_rope_store_kv(qkv, *args)
            return qkv

        want = unfused()
        yield measure(Measurement(GROUP, "qkv + norm + rope + kv", n, None, "cuBLAS, qk_norm_rope_store_kv",
                                  "baseline", nbytes=nbytes), unfused)
        yield measure(Measurement(GROUP, "qkv GEMM alone", n, None, "cuBLAS", "candidate", nbytes=nbytes),
                      lambda x=x: torch.mm(x, w.t()))
        if not supports(x, d):
            continue
        for name, tiles in VARIANTS.items():
            out: list[torch.Tensor] = []

            def fused(x: torch.Tensor = x, args: tuple = args, tiles: dict = tiles, out: list = out) -> None:
                out[:] = [linear_qk_norm_rope_store_kv(x, w, *args, **tiles)]

            role = "default" if name == "default" else "candidate"
            yield measure(Measurement(GROUP, "qkv + norm + rope + kv", n, None, f"fused {name}", role,
                                      nbytes=nbytes), fused, check=lambda out=out, want=want: rel_err(out[0], want))
        del x, cache
        torch.cuda.empty_cache()
