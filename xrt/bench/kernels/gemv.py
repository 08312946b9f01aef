"""The skinny GEMM (xrt.kernels.gemv) against F.linear (cuBLAS) at the model's linear shapes and the decode
batches `bench.batch`: every candidate config, the one xrt picks first. Each timed call runs over enough
copies of the weight to overflow L2 (in a decode step every weight comes from HBM); the time is per copy.
The cases `qkv+norm` and `gate_up+norm` (batches of at most 4 rows) time the residual add and RMSNorm before
those projections (executor.fuse_norm): the fused_add_rms_norm kernel then xrt's GEMV (gate_up with its
activation), the two launches a layer runs without it, against one launch with the norm as the GEMV's prologue,
for every FMA candidate config."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from xrt.bench.kernels.timing import Measurement, cold_copies, measure, rel_err
from xrt.config import ModelArgs, XrtConfig
from xrt.config.bench import KernelGroup

GROUP = KernelGroup.GEMV.value


def linear_shapes(m: ModelArgs) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer of one decode step (tensor parallelism aside)."""
    q, kv = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    return {"qkv": (q + 2 * kv, m.hidden_size), "o_proj": (m.hidden_size, q),
            "gate_up": (2 * m.intermediate_size, m.hidden_size), "down": (m.hidden_size, m.intermediate_size),
            "lm_head": (m.vocab_size, m.hidden_size)}


def run_shape(layer: str, rows: int, weights: list[torch.Tensor]) -> Iterator[Measurement]:
    from xrt.kernels.gemv import candidate_configs, gemv, prefer_gemv

    n, k = weights[0].shape
    dtype, device = weights[0].dtype, weights[0].device
    x = torch.randn(rows, k, dtype=dtype, device=device)
    out = torch.empty(rows, n, dtype=dtype, device=device)
    nbytes = (n * k + rows * k + rows * n) * dtype.itemsize
    ref = F.linear(x, weights[0])

    def run_torch() -> None:
        for w in weights:
            F.linear(x, w)

    yield _per_copy(measure(Measurement(GROUP, layer, rows, None, "F.linear", "baseline", nbytes=nbytes),
                            lambda: F.linear(x, weights[0]), run_torch), len(weights))
    # candidate_configs puts xrt's pick first; xrt runs it only where prefer_gemv says the kernel wins.
    for i, config in enumerate(candidate_configs(rows, n, k)):
        m = Measurement(GROUP, layer, rows, None, str(config), "default" if i == 0 else "candidate", nbytes=nbytes)
        if i == 0 and not prefer_gemv(rows, n, k):
            m.note = "xrt runs F.linear here"

        def run_all(config: object = config) -> None:
            for w in weights:
                gemv(x, w, out=out, config=config)

        yield _per_copy(measure(m, lambda config=config: gemv(x, weights[0], out=out, config=config), run_all,
                                check=lambda: rel_err(out, ref)), len(weights))


def run_norm_shape(layer: str, rows: int, weights: list[torch.Tensor]) -> Iterator[Measurement]:
    """`<layer>+norm`: fused_add_rms_norm and the GEMV apart (baseline) against the norm prologue (gate_up gated,
    as the layer runs it)."""
    import xrt.ops  # noqa: F401  (declares torch.ops.xrt)
    from xrt.kernels.gemv import NormPrologue, candidate_configs, gemv, prefer_gemv
    from xrt.kernels.rms_norm import fused_add_rms_norm

    n, k = weights[0].shape
    dtype, device = weights[0].dtype, weights[0].device
    gated = layer == "gate_up"
    x = torch.randn(rows, k, dtype=dtype, device=device)
    residual = torch.randn(rows, k, dtype=dtype, device=device)
    norm_w = torch.rand(k, device=device).add_(0.5).to(dtype)
    summed, normed = torch.empty_like(residual), torch.empty_like(x)
    out = torch.empty(rows, n // 2 if gated else n, dtype=dtype, device=device)
    # w, then x, the residual and the norm weight read and the residual sum written; the output.
    nbytes = (n * k + 4 * rows * k + k + out.numel()) * dtype.itemsize
    case = f"{layer}+norm"
    ref_normed = torch.empty_like(x)
    fused_add_rms_norm(x, residual, norm_w, 1e-6, None, ref_normed, summed)
    ref = F.linear(ref_normed.float(), weights[0].float())
    if gated:
        ref = F.silu(ref[:, : n // 2]) * ref[:, n // 2:]

    project = torch.ops.xrt.linear_silu_and_mul if gated else torch.ops.xrt.linear
    last: list[torch.Tensor] = []

    def apart(w: torch.Tensor) -> None:
        fused_add_rms_norm(x, residual, norm_w, 1e-6, None, normed, summed)
        last[:] = [project(normed, w)]

    # What the layer runs without executor.fuse_norm: the norm kernel, then xrt::linear's route (the skinny GEMM
    # or cuBLAS, gate_up with its activation).
    yield _per_copy(measure(Measurement(GROUP, case, rows, None, "fused_add_rms_norm + xrt::linear", "baseline",
                                        nbytes=nbytes),
                            lambda: apart(weights[0]), lambda: [apart(w) for w in weights],
                            check=lambda: rel_err(last[0], ref)), len(weights))
    norm = NormPrologue(residual, norm_w, 1e-6, summed)
    # xrt::add_rms_norm_linear runs the prologue with the picked config where it is an FMA one (else apart).
    candidates = candidate_configs(rows, n, k)
    for config in (c for c in candidates if not c.use_dot):
        def fused(w: torch.Tensor, config: object = config) -> None:
            gemv(x, w, out=out, config=config, gated=gated, norm=norm)

        role = "default" if config == candidates[0] and prefer_gemv(rows, n, k) else "candidate"
        m = Measurement(GROUP, case, rows, None, f"norm prologue {config}", role, nbytes=nbytes)
        yield _per_copy(measure(m, lambda fused=fused: fused(weights[0]),
                                lambda fused=fused: [fused(w) for w in weights],
                                check=lambda: rel_err(out, ref)), len(weights))


def _per_copy(m: Measurement, copies: int) -> Measurement:
    if m.us is not None:
        m.us /= copies
    return m


def run(cfg: XrtConfig, dtype: torch.dtype, device: torch.device) -> Iterator[Measurement]:
    for layer, (n, k) in linear_shapes(cfg.model).items():
        copies = cold_copies(n * k * dtype.itemsize)
        weights = [torch.randn(n, k, device=device).mul_(k**-0.5).to(dtype) for _ in range(copies)]
        for rows in cfg.bench.batch:
            yield from run_shape(layer, rows, weights)
        if layer in ("qkv", "gate_up"):
            for rows in (r for r in cfg.bench.batch if r <= 4):
                yield from run_norm_shape(layer, rows, weights)
        del weights
        torch.cuda.empty_cache()
