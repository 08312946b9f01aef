"""KV sizing and the device cache: the profiling step that sizes the CUDA KV cache (the largest prefill the
scheduler can build), the page count from the config less a reserve, and the tensor bound to every layer."""

from __future__ import annotations

import logging
import types
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from xrt.config import CacheArgs, XrtConfig
from xrt.executor.memory import profile_step
from xrt.kvcache.device import DeviceKVCache, KVLayout, scratch_kv_cache
from xrt.kvcache.sizing import KVReserve, leave_reserve, num_pages, page_cap, pages_needed


def test_profile_step_splits_the_token_budget_by_max_model_len() -> None:
    step = profile_step(max_batched_tokens=2500, max_num_seqs=256, max_model_len=1024, page_size=16)
    assert step.is_prefill
    assert [len(s.token_ids) for s in step.seqs] == [1024, 1024, 452]
    assert step.num_tokens == 2500
    assert all(s.needs_logits and s.start_pos == 0 for s in step.seqs)
    pages = [p for s in step.seqs for p in s.page_table]
    assert pages == list(range(64 + 64 + 29))  # disjoint, each covers its tokens


def test_profile_step_respects_max_num_seqs() -> None:
    step = profile_step(max_batched_tokens=8192, max_num_seqs=2, max_model_len=1024, page_size=16)
    assert [len(s.token_ids) for s in step.seqs] == [1024, 1024]


# -- the device side: layout, the tensor and its per-layer views, the scratch cache, the page count ------



def layers(n: int) -> list[types.SimpleNamespace]:
    return [types.SimpleNamespace(layer_idx=i, num_kv_heads=2, head_dim=8, kv_cache=torch.empty(0)) for i in range(n)]


def test_device_cache_binds_each_layer_to_its_view() -> None:
    ls = layers(3)
    layout = KVLayout.of(ls, page_size=4, dtype=torch.bfloat16)
    assert layout.bytes_per_page == 3 * 2 * 4 * 2 * 8 * 2
    cache = DeviceKVCache(ls, layout, 5, torch.device("cpu"))
    assert cache.tensor.shape == (3, 5, 2, 4, 2, 8) and cache.tensor.dtype == torch.bfloat16
    assert not cache.tensor.any()
    for i, layer in enumerate(ls):
        assert layer.kv_cache.data_ptr() == cache.tensor[i].data_ptr() and layer.kv_cache.shape == (5, 2, 4, 2, 8)
    with scratch_kv_cache(ls, layout, 2, torch.device("cpu")) as scratch:
        assert all(layer.kv_cache is scratch for layer in ls) and scratch.shape == (2, 2, 4, 2, 8)
    assert [layer.kv_cache.data_ptr() for layer in ls] == [cache.tensor[i].data_ptr() for i in range(3)]


def test_num_pages_from_the_config_and_the_reserve() -> None:
    ls = layers(2)
    layout = KVLayout.of(ls, page_size=4, dtype=torch.float32)
    cpu = torch.device("cpu")
    per_page = layout.bytes_per_page  # 2 layers x K,V x 4 tokens x 2 heads x 8 x 4 B = 1024 B

    def unmeasured() -> int:  # on CPU the size is the config's: nothing is measured
        raise AssertionError("measured a peak on CPU")

    assert num_pages(XrtConfig(cache=CacheArgs(page_size=4, num_pages=7)), per_page, cpu, unmeasured) == 7
    cfg = XrtConfig(cache=CacheArgs(page_size=4, kv_size_gb=1e-4))
    assert num_pages(cfg, per_page, cpu, unmeasured) == 100_000 // per_page
    reserve = KVReserve(3 * per_page - 1, "the test", "no room left")
    assert num_pages(cfg, per_page, cpu, unmeasured, lambda: reserve) == 100_000 // per_page - 3
    assert leave_reserve(4, per_page, reserve) == 1
    with pytest.raises(ValueError, match="^no room left$"):
        leave_reserve(3, per_page, reserve)
    with pytest.raises(ValueError, match=r"^cache.kv_size_gb: 1e-09 GB holds no 1024-byte KV page"):
        num_pages(XrtConfig(cache=CacheArgs(page_size=4, kv_size_gb=1e-9)), per_page, cpu, unmeasured)


# -- the cap on a cache sized from GPU memory (cache.max_pages_over_need), on a pretended H200 --------------

H200_BYTES = 143_771_287_552  # torch.cuda.mem_get_info's total on the H200 machine (bench/results)


def bf16_page_bytes(cfg: XrtConfig) -> int:
    m = cfg.model
    return m.num_hidden_layers * 2 * cfg.cache.page_size * m.num_key_value_heads * m.head_dim * 2


@pytest.fixture
def h200(monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """A CUDA device whose memory is an idle H200's, 1 GiB in use: sizing asks only `device_used_bytes`."""
    from xrt.kvcache import sizing

    monkeypatch.setattr(sizing, "device_used_bytes", lambda device: (2**30, H200_BYTES))
    monkeypatch.setattr(sizing, "available_bytes", lambda device: H200_BYTES - 2**30)
    return torch.device("cuda")


@contextmanager
def propagating(logger: logging.Logger) -> Iterator[None]:
    """xrt's loggers stop at `xrt` (xrt/log.py); caplog listens at the root."""
    root = logging.getLogger("xrt")
    old = root.propagate
    root.propagate = True
    try:
        yield
    finally:
        root.propagate = old


def memory_pages(cfg: XrtConfig, per_page: int) -> int:
    return (int(H200_BYTES * cfg.cache.max_memory_utilization) - 2**30) // per_page


def test_a_cache_sized_from_memory_is_capped_at_a_multiple_of_what_sequences_fill(
    h200: torch.device, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = XrtConfig()  # the tiny model: max_num_seqs 256, max_model_len 1024, 16-token pages
    per_page = bf16_page_bytes(cfg)
    need = cfg.scheduler.max_num_seqs * -(-(cfg.model.max_model_len + 1) // cfg.cache.page_size)
    assert pages_needed(cfg) == need == 256 * 65
    assert memory_pages(cfg, per_page) > 100 * need  # what the budget alone would give: millions of pages
    logger = logging.getLogger("xrt.kvcache.sizing")
    with caplog.at_level(logging.INFO, logger=logger.name), propagating(logger):
        assert num_pages(cfg, per_page, h200, lambda: 0) == page_cap(cfg) == 4 * need
    assert f"capped at {4 * need} pages" in caplog.text
    assert "cache.max_pages_over_need=4 x the 16640 pages 256 sequences of 1024 tokens fill" in caplog.text
    half = XrtConfig(cache=CacheArgs(max_pages_over_need=0.5))
    assert num_pages(half, per_page, h200, lambda: 0) == need // 2
    uncapped = XrtConfig(cache=CacheArgs(max_pages_over_need=0))
    assert page_cap(uncapped) is None and num_pages(uncapped, per_page, h200, lambda: 0) == memory_pages(cfg, per_page)
    # a reserve comes out of memory, not out of the cap
    reserve = KVReserve(10 * per_page, "the prefill graphs", "no room")
    assert num_pages(cfg, per_page, h200, lambda: 0, lambda: reserve) == 4 * need
    # a size the user gives is theirs
    fixed = XrtConfig(cache=CacheArgs(num_pages=50 * need))
    assert num_pages(fixed, per_page, h200, lambda: 0) == 50 * need


@pytest.mark.parametrize("model", ["qwen3-0.6b", "qwen3-8b"])
def test_real_shapes_fill_an_h200_before_the_cap(h200: torch.device, model: str) -> None:
    from xrt.config.compose import load_config

    cfg = load_config([f"model={model}", "model.load_format=dummy"])
    per_page = bf16_page_bytes(cfg)
    assert page_cap(cfg) * per_page > H200_BYTES  # 4 x their need is more than the whole GPU
    assert num_pages(cfg, per_page, h200, lambda: 0) == memory_pages(cfg, per_page)
