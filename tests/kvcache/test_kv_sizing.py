"""KV sizing and the device cache: the profiling step that sizes the CUDA KV cache (the largest prefill the
scheduler can build), the page count from the config less a reserve, and the tensor bound to every layer."""

from __future__ import annotations

import types

import pytest
import torch

from xrt.config import CacheArgs, XrtConfig
from xrt.executor.memory import profile_step
from xrt.kvcache.device import DeviceKVCache, KVLayout, scratch_kv_cache
from xrt.kvcache.sizing import KVReserve, leave_reserve, num_pages


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
