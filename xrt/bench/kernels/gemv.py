"""The skinny GEMM (xrt.kernels.gemv) against F.linear (cuBLAS) at the model's linear shapes and the decode
batches `bench.batch`: every candidate config, the one xrt picks first. Each timed call runs over enough
copies of the weight to overflow L2 (in a decode step every weight comes from HBM); the time is per copy."""

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
        del weights
        torch.cuda.empty_cache()
