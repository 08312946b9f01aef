"""Decode attention at the model's attention shape, for every batch in `bench.batch` and context in
`bench.context_len`, page size `cache.page_size`, pages shuffled:
- decode_attention: the split-KV Triton kernel (xrt.kernels.decode_attention) as xrt's FlashInfer backend
  builds it, and a few variants of it, against FlashInfer's decode wrapper as the backend calls it;
- flashinfer: FlashInfer's decode through the CUDA-graph wrappers the executor replays, tensor cores off/on x
  split-KV auto/off (`disable_split_kv`), against xrt's setting.
Every timed call runs over enough per-layer KV caches (same page table, as the layers of a decode step) to
overflow L2; the time is per layer. Every output is checked against a dense fp32 torch reference first."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from xrt.bench.kernels.timing import Measurement, cold_copies, error_note, measure, rel_err
from xrt.config import XrtConfig
from xrt.config.bench import KernelGroup

WORKSPACE_BYTES = 256 << 20


@dataclass
class PagedProblem:
    """One decode step's attention inputs: `layers` KV caches sharing one shuffled page table."""

    batch: int
    context: int
    heads: int
    kv_heads: int
    head_dim: int
    page: int
    caches: torch.Tensor  # [layers, pages, 2, page, kv_heads, head_dim]
    q: torch.Tensor  # [batch, heads, head_dim]
    indptr: torch.Tensor  # host int32 [batch + 1]
    indices: torch.Tensor  # host int32
    last: torch.Tensor  # host int32 [batch]
    out: torch.Tensor
    _ref: torch.Tensor | None = None

    @classmethod
    def make(cls, cfg: XrtConfig, batch: int, context: int, dtype: torch.dtype, device: torch.device) -> PagedProblem:
        m, page = cfg.model, cfg.cache.page_size
        h, kv, d = m.num_attention_heads, m.num_key_value_heads, m.head_dim
        per_seq = -(-context // page)
        needed = batch * per_seq
        num_pages = needed + needed // 8 + 1  # spare pages: the ids are a shuffled subset
        layers = cold_copies(num_pages * 2 * page * kv * d * dtype.itemsize)
        q = torch.randn(batch, h, d, device=device, dtype=dtype)
        return cls(batch, context, h, kv, d, page,
                   torch.randn(layers, num_pages, 2, page, kv, d, device=device, dtype=dtype), q,
                   torch.arange(batch + 1, dtype=torch.int32) * per_seq,
                   torch.randperm(num_pages, dtype=torch.int32)[:needed],
                   torch.full((batch,), context - (per_seq - 1) * page, dtype=torch.int32), torch.empty_like(q))

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5

    @property
    def kv_bytes(self) -> int:
        return self.batch * self.context * self.kv_heads * self.head_dim * 2 * self.caches.element_size()

    def reference(self) -> torch.Tensor:
        """Dense fp32 attention of every sequence over its `context` tokens, on layer 0's cache."""
        b, kv, d = self.batch, self.kv_heads, self.head_dim
        idx = self.indices.to(self.caches.device).long()
        pages = self.caches[0][idx].view(b, -1, 2, self.page, kv, d).transpose(1, 2)
        keys_values = pages.reshape(b, 2, -1, kv, d)[:, :, : self.context].float()
        qg = self.q.float().view(b, kv, self.heads // kv, d)
        probs = (torch.einsum("bkgd,btkd->bkgt", qg, keys_values[:, 0]) * self.scale).softmax(dim=-1)
        return torch.einsum("bkgt,btkd->bkgd", probs, keys_values[:, 1]).reshape(b, self.heads, d)

    def measure(self, m: Measurement, launch: Callable[[torch.Tensor], object]) -> Measurement:
        """Time launch(cache) over every layer's cache, per layer, after checking layer 0's output."""
        if self._ref is None:
            self._ref = self.reference()
        ref = self._ref
        layers = self.caches.shape[0]

        def first() -> None:
            self.out.fill_(float("nan"))
            launch(self.caches[0])

        def every_layer() -> None:
            for i in range(layers):
                launch(self.caches[i])

        m.nbytes = self.kv_bytes
        measure(m, first, every_layer, check=lambda: rel_err(self.out, ref))
        if m.us is not None:
            m.us /= layers
        return m


def _variants(heads: int, kv_heads: int) -> dict[str, dict[str, Any]]:
    """Kernel variants beside xrt's own (DecodeAttention keyword arguments; max_splits may be a function of
    (batch, context))."""
    from xrt.kernels.decode_attention import TARGET_PROGRAMS

    return {
        "defaults": {},
        "st32": {"split_tokens": 32},
        "st128": {"split_tokens": 128},
        "st256": {"split_tokens": 256},
        # Twice the programs: the split cap aimed at 4 per SM instead of 2.
        "2x programs": {"max_splits": lambda b, c: -(-2 * TARGET_PROGRAMS // (b * kv_heads))},
        # Fixed 64-token splits whatever the batch (the grid grows with the context).
        "fixed st64": {"split_tokens": 64, "max_splits": lambda b, c: -(-c // 64)},
        "bn32": {"block_n": 32},
        "stages2": {"num_stages": 2},
        "bn32 stages4": {"block_n": 32, "num_stages": 4},
    }


def _flashinfer_run(p: PagedProblem, wrapper: Any) -> Callable[[torch.Tensor], object]:
    """The wrapper's run as xrt's backend calls it (PDL on Hopper), writing into p.out where it can."""
    params = inspect.signature(wrapper.run).parameters
    extra = {"enable_pdl": torch.cuda.get_device_capability()[0] >= 9} if "enable_pdl" in params else {}
    if "out" in params:
        return lambda c: wrapper.run(p.q, c, out=p.out, **extra)
    return lambda c: p.out.copy_(wrapper.run(p.q, c, **extra))


def decode_attention(cfg: XrtConfig, p: PagedProblem) -> Iterator[Measurement]:
    from xrt.attention.flashinfer import SMALL_DECODE_FIXED_BATCH, SMALL_DECODE_SPLIT_TOKENS, use_tensor_cores
    from xrt.kernels.decode_attention import DecodeAttention

    group, device, dtype = KernelGroup.DECODE_ATTENTION.value, p.q.device, p.q.dtype
    base = Measurement(group, "decode attention", p.batch, p.context, "flashinfer", "baseline")
    try:
        import flashinfer

        ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_tensor_cores=use_tensor_cores(p.heads, p.kv_heads))
        wrapper.plan(p.indptr, p.indices.to(device), p.last, p.heads, p.kv_heads, p.head_dim, p.page,
                     q_data_type=dtype, kv_data_type=dtype, sm_scale=p.scale)
        yield p.measure(base, _flashinfer_run(p, wrapper))
    except Exception as e:
        base.status, base.note = "error", error_note(e)
        yield base
    indptr, indices, last = p.indptr.to(device), p.indices.to(device), p.last.to(device)
    # As the backend builds it: chunks of SMALL_DECODE_SPLIT_TOKENS, split count fixed for its longest sequence
    # up to SMALL_DECODE_FIXED_BATCH rows.
    max_pages = -(-(max(cfg.model.max_model_len, p.context) + 1) // p.page)
    xrt = {"split_tokens": SMALL_DECODE_SPLIT_TOKENS,
           "max_splits": -(-max_pages * p.page // SMALL_DECODE_SPLIT_TOKENS),
           "fixed_max_batch": SMALL_DECODE_FIXED_BATCH}
    for name, kwargs in {"xrt": xrt, **_variants(p.heads, p.kv_heads)}.items():
        m = Measurement(group, "decode attention", p.batch, p.context, name, "default" if name == "xrt" else
                        "candidate")
        try:
            resolved = {k: v(p.batch, p.context) if callable(v) else v for k, v in kwargs.items()}
            attn = DecodeAttention(p.batch, p.heads, p.kv_heads, p.head_dim, p.page, max_pages, device, **resolved)
            m.note = f"{min(attn.splits_for(p.batch), -(-p.context // attn.split_tokens))} chunks per sequence"
        except Exception as e:
            m.status, m.note = "error", error_note(e)
            yield m
            continue
        yield p.measure(m, lambda c, a=attn: a.run(p.q, c, indptr, indices, last, p.scale, out=p.out))


def flashinfer_settings(cfg: XrtConfig, p: PagedProblem) -> Iterator[Measurement]:
    import flashinfer

    from xrt.attention.flashinfer import use_tensor_cores

    group, device, dtype = KernelGroup.FLASHINFER.value, p.q.device, p.q.dtype
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    indptr, indices, last = p.indptr.to(device), p.indices.to(device), p.last.to(device)
    ours = use_tensor_cores(p.heads, p.kv_heads)
    for tc in (False, True):
        for no_split in (False, True):
            name = f"tensor cores {'on' if tc else 'off'}, split-KV {'off' if no_split else 'auto'}"
            m = Measurement(group, "graph decode", p.batch, p.context, name,
                            "baseline" if tc == ours and not no_split else "candidate")
            try:
                wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    ws, "NHD", use_tensor_cores=tc, use_cuda_graph=True, paged_kv_indptr_buffer=indptr,
                    paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last)
                wrapper.plan(p.indptr, p.indices, p.last, p.heads, p.kv_heads, p.head_dim, p.page,
                             q_data_type=dtype, kv_data_type=dtype, sm_scale=p.scale, disable_split_kv=no_split)
            except Exception as e:
                m.status, m.note = "error", error_note(e)
                yield m
                continue
            yield p.measure(m, _flashinfer_run(p, wrapper))


def run(cfg: XrtConfig, dtype: torch.dtype, device: torch.device, groups: list[KernelGroup]) -> Iterator[Measurement]:
    for batch in cfg.bench.batch:
        for context in cfg.bench.context_len:
            p = PagedProblem.make(cfg, batch, context, dtype, device)
            if KernelGroup.DECODE_ATTENTION in groups:
                yield from decode_attention(cfg, p)
            if KernelGroup.FLASHINFER in groups:
                yield from flashinfer_settings(cfg, p)
            del p
            torch.cuda.empty_cache()
