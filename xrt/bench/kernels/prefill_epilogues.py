"""The prefill's GEMMs with fused epilogues against what the layers run with them off, at `bench.kernel_tokens`
tokens of the model's shape:
- qkv: cuBLAS then xrt::qk_norm_rope_store_kv, against xrt.kernels.qkv_gemm (the q/k norm, RoPE and KV write in
  the GEMM's epilogue; `executor.fuse_qkv_epilogue`) and a few tilings of it;
- gate_up: cuBLAS then xrt::silu_and_mul, against xrt.kernels.gate_up_gemm (silu(gate) * up in the epilogue;
  `executor.fuse_prefill_activation`) and a few tilings;
- both again with the layer's RMSNorm before them: xrt::rms_norm first, against the kernels with the norm as their
  prologue (`executor.fuse_prefill_norms`);
- o_proj and down: cuBLAS then the residual add (torch), against xrt.kernels.residual_gemm (the add in the
  epilogue; `executor.fuse_prefill_norms`) and a few tilings.
The cuBLAS GEMM alone is a line of its own: the floor the epilogue adds to. Replayed from a CUDA graph (launch
overhead out, as in the prefill graphs); every fused variant is checked against the unfused output first."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from xrt.bench.kernels.elementwise import rope_cache
from xrt.bench.kernels.timing import Measurement, measure, rel_err
from xrt.config import XrtConfig
from xrt.config.bench import KernelGroup

GROUP = KernelGroup.PREFILL_EPILOGUES.value
# Tilings beside each kernel's defaults, a few each: every one is a compile on a fresh machine (qkv_gemm: 128
# tokens x one head, K step 64, 8 warps, 3 stages, one dot, pointer loads; gate_up_gemm: 128 tokens x 64 columns, the
# same K step, warps and stages; residual_gemm: 128 x 128 tiles, or 64 tokens and 4 warps where 128 x 128 tiles fall
# short of one wave, which the two bm lines force each way). The kernels' other arguments (`one_dot=False`,
# `block_k=128`, ...) stay callable for a longer look.
QKV_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "tma": {"tma": True},
    "stages4": {"num_stages": 4},
    "bm64 warps4": {"block_m": 64, "num_warps": 4},
}
GATE_UP_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "tma": {"tma": True},
    "bn128": {"block_n": 128},
    "bm64 warps4": {"block_m": 64, "num_warps": 4},
}
NORM_VARIANTS: dict[str, dict[str, Any]] = {"default": {}, "tma": {"tma": True}}
RESIDUAL_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "tma": {"tma": True},
    "bm128 warps8": {"block_m": 128, "num_warps": 8},
    "bm64 warps4": {"block_m": 64, "num_warps": 4},
    "stages4": {"num_stages": 4},
    "bn64": {"block_n": 64},
}


def _lines(case: str, n: int, nbytes: int, unfused: Callable[[], torch.Tensor], cublas: Callable[[], object],
           fused: Callable[..., torch.Tensor] | None, variants: dict[str, dict[str, Any]]) -> Iterator[Measurement]:
    """The unfused pair (baseline), cuBLAS alone, then each variant of the fused kernel checked against the pair."""
    want = unfused()
    yield measure(Measurement(GROUP, case, n, None, "cuBLAS + separate kernel", "baseline", nbytes=nbytes), unfused)
    yield measure(Measurement(GROUP, case, n, None, "cuBLAS GEMM alone", "candidate", nbytes=nbytes), cublas)
    if fused is None:
        return
    for name, tiles in variants.items():
        out: list[torch.Tensor] = []

        def run(tiles: dict = tiles, out: list = out) -> None:
            out[:] = [fused(**tiles)]

        yield measure(Measurement(GROUP, case, n, None, f"fused {name}", "default" if name == "default" else
                                  "candidate", nbytes=nbytes), run, check=lambda out=out: rel_err(out[0], want))


def run(cfg: XrtConfig, dtype: torch.dtype, device: torch.device) -> Iterator[Measurement]:
    from xrt.kernels import gate_up_gemm, qkv_gemm, residual_gemm
    from xrt.kernels.qk_norm_rope import qk_norm_rope_store_kv
    from xrt.kernels.rms_norm import rms_norm
    from xrt.kernels.silu_and_mul import silu_and_mul

    m, page = cfg.model, cfg.cache.page_size
    heads, kv_heads, d, hidden, inter, eps = (m.num_attention_heads, m.num_key_value_heads, m.head_dim,
                                              m.hidden_size, m.intermediate_size, m.rms_norm_eps)
    width = (heads + 2 * kv_heads) * d
    w_qkv = torch.randn(width, hidden, device=device).mul_(hidden**-0.5).to(dtype)
    w_gate_up = torch.randn(2 * inter, hidden, device=device).mul_(hidden**-0.5).to(dtype)
    w_o = torch.randn(hidden, heads * d, device=device).mul_((heads * d)**-0.5).to(dtype)
    w_down = torch.randn(hidden, inter, device=device).mul_(inter**-0.5).to(dtype)
    q_w, k_w = (torch.randn(d, device=device) * 0.5 + 1).to(dtype), (torch.randn(d, device=device) * 0.5 + 1).to(dtype)
    norm_w = (torch.rand(hidden, device=device) + 0.5).to(dtype)
    max_pos = min(m.max_position_embeddings, 1 << 16)
    cos_sin = rope_cache(d, m.rope_theta, max_pos, device)
    elem = dtype.itemsize
    for n in cfg.bench.kernel_tokens:
        x = torch.randn(n, hidden, device=device).to(dtype)
        positions = torch.randint(0, max_pos, (n,), device=device)
        num_pages = -(-n // page) + 1
        cache = torch.zeros(num_pages, 2, page, kv_heads, d, device=device, dtype=dtype)
        slots = torch.randperm(num_pages * page, device=device)[:n]
        args = (q_w, k_w, cos_sin, positions, cache, slots, heads, kv_heads, d, eps)

        def qkv_unfused(x: torch.Tensor = x, args: tuple = args) -> torch.Tensor:
            qkv = torch.mm(x, w_qkv.t())
            qk_norm_rope_store_kv(qkv, *args)
            return qkv

        def qkv_fused(x: torch.Tensor = x, args: tuple = args, **tiles: Any) -> torch.Tensor:
            return qkv_gemm.linear_qk_norm_rope_store_kv(x, w_qkv, *args, **tiles)

        # x and the weight in, qkv out, k and v into the cache
        nbytes = (n * hidden + width * hidden + n * width + 2 * n * kv_heads * d) * elem
        yield from _lines("qkv + norm + rope + kv", n, nbytes, qkv_unfused, lambda x=x: torch.mm(x, w_qkv.t()),
                          qkv_fused if qkv_gemm.supports(x, d) else None, QKV_VARIANTS)

        def gate_up_unfused(x: torch.Tensor = x) -> torch.Tensor:
            return silu_and_mul(torch.mm(x, w_gate_up.t()))

        def gate_up_fused(x: torch.Tensor = x, **tiles: Any) -> torch.Tensor:
            return gate_up_gemm.linear_silu_and_mul(x, w_gate_up, **tiles)

        # x and the weight in, the activation out
        nbytes = (n * hidden + 2 * inter * hidden + n * inter) * elem
        yield from _lines("gate_up + silu_and_mul", n, nbytes, gate_up_unfused,
                          lambda x=x: torch.mm(x, w_gate_up.t()),
                          gate_up_fused if gate_up_gemm.supports(x) else None, GATE_UP_VARIANTS)

        # The same two with the RMSNorm before them: the stream at a residual's scale, normalised by xrt::rms_norm
        # (one more read and write of [n, hidden]) or in the GEMM's prologue.
        stream = (x.float() * 8).to(dtype)

        def norm_qkv_unfused(stream: torch.Tensor = stream, args: tuple = args) -> torch.Tensor:
            qkv = torch.mm(rms_norm(stream, norm_w, eps), w_qkv.t())
            qk_norm_rope_store_kv(qkv, *args)
            return qkv

        def norm_qkv_fused(stream: torch.Tensor = stream, args: tuple = args, **tiles: Any) -> torch.Tensor:
            return qkv_gemm.linear_qk_norm_rope_store_kv(stream, w_qkv, *args, norm_w, **tiles)

        nbytes = (n * hidden + width * hidden + n * width + 2 * n * kv_heads * d) * elem
        yield from _lines("rms_norm + qkv + norm + rope + kv", n, nbytes, norm_qkv_unfused,
                          lambda stream=stream: torch.mm(stream, w_qkv.t()),
                          norm_qkv_fused if qkv_gemm.supports(x, d) else None, NORM_VARIANTS)

        def norm_gate_up_unfused(stream: torch.Tensor = stream) -> torch.Tensor:
            return silu_and_mul(torch.mm(rms_norm(stream, norm_w, eps), w_gate_up.t()))

        def norm_gate_up_fused(stream: torch.Tensor = stream, **tiles: Any) -> torch.Tensor:
            return gate_up_gemm.linear_silu_and_mul(stream, w_gate_up, norm_w, eps, **tiles)

        nbytes = (n * hidden + 2 * inter * hidden + n * inter) * elem
        yield from _lines("rms_norm + gate_up + silu_and_mul", n, nbytes, norm_gate_up_unfused,
                          lambda stream=stream: torch.mm(stream, w_gate_up.t()),
                          norm_gate_up_fused if gate_up_gemm.supports(x) else None, NORM_VARIANTS)

        # o_proj and down with the residual add after them.
        for case, k, w in (("o_proj + residual add", heads * d, w_o), ("down + residual add", inter, w_down)):
            a = torch.randn(n, k, device=device).to(dtype)

            def add_unfused(a: torch.Tensor = a, w: torch.Tensor = w, res: torch.Tensor = stream) -> torch.Tensor:
                return torch.mm(a, w.t()) + res

            def add_fused(a: torch.Tensor = a, w: torch.Tensor = w, res: torch.Tensor = stream,
                          **tiles: Any) -> torch.Tensor:
                return residual_gemm.linear_add(a, w, res, **tiles)

            # a, the weight and the residual in, the new stream out
            nbytes = (n * k + hidden * k + 2 * n * hidden) * elem
            yield from _lines(case, n, nbytes, add_unfused, lambda a=a, w=w: torch.mm(a, w.t()),
                              add_fused if residual_gemm.supports(a) else None, RESIDUAL_VARIANTS)
            del a
        del x, cache, stream
        torch.cuda.empty_cache()
