"""Copies between the device KV tensor and L1 slots by runs of consecutive pages (xrt/kvstore/copy.py, the
strided row copies of memcpy.py: memmove rows on CPU, the same address arithmetic cudaMemcpy2DAsync gets on
CUDA), against index_select / index_copy_ over the same pages; the layer groups of a load and the KV cache's
per-layer arrivals."""

from __future__ import annotations

import random

import pytest
import torch

from xrt.kvcache.device import KVArrivals, KVLayout, layer_groups
from xrt.kvstore.chunk import ChunkLayout
from xrt.kvstore.copy import ChunkCopier, page_runs
from xrt.kvstore.l1 import L1Cache

PAGES = 40


def layout_of(dtype: torch.dtype, layers: int = 3) -> ChunkLayout:
    return ChunkLayout(KVLayout(num_layers=layers, page_size=4, num_kv_heads=2, head_dim=8, dtype=dtype), 16)


def kv_of(layout: ChunkLayout, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k = layout.kv
    return torch.randn((k.num_layers, PAGES, 2, k.page_size, k.num_kv_heads, k.head_dim), generator=g).to(k.dtype)


def test_page_runs() -> None:
    assert page_runs([]) == []
    assert page_runs([5]) == [(0, 5, 1)]
    assert page_runs([4, 5, 6, 7]) == [(0, 4, 4)]
    assert page_runs([4, 5, 9, 10, 11, 3]) == [(0, 4, 2), (2, 9, 3), (5, 3, 1)]
    assert page_runs([7, 6, 5]) == [(0, 7, 1), (1, 6, 1), (2, 5, 1)]  # descending: a run per page


def test_layer_groups_cover_every_layer_once_in_order() -> None:
    for layers in (1, 2, 3, 6, 7, 28, 36):
        for groups in (1, 4, 6, 50):
            got = layer_groups(layers, groups)
            assert got[0][0] == 0 and got[-1][1] == layers and len(got) == min(groups, layers)
            assert all(a[1] == b[0] for a, b in zip(got, got[1:], strict=False))
            assert all(end > first for first, end in got)


PAGE_LISTS = [
    [0, 1, 2, 3],  # one run from the first page
    [36, 37, 38, 39],  # one run ending at the last page
    [9, 3, 22, 30],  # no two consecutive
    [12, 13, 5, 6],  # two runs
    [21, 20, 19, 18],  # descending
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pages", PAGE_LISTS)
def test_gather_is_index_select(dtype: torch.dtype, pages: list[int]) -> None:
    layout = layout_of(dtype)
    kv = kv_of(layout, 1)
    l1 = L1Cache(layout, 3 * layout.nbytes)
    l1.buffer.fill_(0xAB)
    slot = l1.reserve(b"k" * 32)
    assert ChunkCopier(kv).gather(pages, l1.slot_view(slot)) is None  # CPU: done when it returns
    assert torch.equal(l1.slot_view(slot), kv.index_select(1, torch.tensor(pages)))
    # the slots beside it are untouched
    others = [s for s in range(l1.num_slots) if s != slot]
    assert all(bool((l1.slot_bytes(s) == 0xAB).all()) for s in others)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [1, 2, 6])
def test_scatter_chunks_is_index_copy(dtype: torch.dtype, groups: int) -> None:
    """Several chunks, some with their leading pages skipped (shared with a GPU hit), into their pages of every
    layer, whatever the layer groups; no other page written."""
    layout = layout_of(dtype, layers=5)
    rng = random.Random(groups)
    kv = kv_of(layout, 2)
    want = kv.clone()
    l1 = L1Cache(layout, 4 * layout.nbytes)
    free = list(range(PAGES))
    rng.shuffle(free)
    chunks, tags = [], []
    for i, (skip, tag) in enumerate([(0, "l1"), (3, "l1"), (0, "l2"), (1, "l2")]):
        slot = l1.reserve(bytes([i]) * 32)
        l1.slot_view(slot).copy_(torch.randn(layout.shape, generator=torch.Generator().manual_seed(10 + i)))
        n = layout.pages_per_chunk - skip
        pages = sorted(free[:n]) if i % 2 == 0 else free[:n]  # sorted: runs; else scattered
        free = free[n:]
        view = l1.slot_view(slot)[:, skip:]
        want.index_copy_(1, torch.tensor(pages), view)
        chunks.append((view, pages, tag))
        tags.append((tag, n))
    copier = ChunkCopier(kv, groups=groups)
    assert copier.scatter_chunks(chunks) is None
    assert torch.equal(kv, want)
    got = {tag: nbytes for tag, nbytes, _ in copier.finished_scatters()}
    page_bytes = kv[:, 0].numel() * kv.element_size()  # a page of every layer: what a chunk's page moves
    assert got == {"l1": (4 + 1) * page_bytes, "l2": (4 + 3) * page_bytes}
    assert copier.finished_scatters() == []  # handed back once


def test_a_slot_of_another_layout_is_refused() -> None:
    layout = layout_of(torch.float32)
    kv = kv_of(layout, 3)
    copier = ChunkCopier(kv)
    l1 = L1Cache(layout, layout.nbytes)
    view = l1.slot_view(l1.reserve(b"k" * 32))
    with pytest.raises(ValueError, match="a slot of 3 pages"):
        copier.gather([1, 2, 3], view)  # 4 pages in the slot
    with pytest.raises(ValueError, match="a slot of 4 pages"):
        copier.gather([1, 2, 3, 4], view.to(torch.float64))
    with pytest.raises(ValueError, match="a slot of 2 pages"):
        copier.scatter_chunks([(view[:, ::2], [1, 2], "")])  # each layer's pages not contiguous
    with pytest.raises(ValueError, match="contiguous KV"):
        ChunkCopier(kv.transpose(0, 1))


def test_arrivals_on_cpu_hold_the_groups_and_nothing_pending() -> None:
    """On CPU a load's copies are done when they return: nothing is ever pending (the CUDA side: test_copy_gpu)."""
    arrivals = KVArrivals(7, torch.device("cpu"), groups=3)
    assert arrivals.groups == [(0, 2), (2, 5), (5, 7)]
    assert arrivals.take() is None and arrivals.events == [] and arrivals.graph_waits() is None
    kv = kv_of(layout_of(torch.float32, layers=7), 4)
    assert ChunkCopier(kv, arrivals).groups == arrivals.groups


def test_deferred_loads_start_at_take() -> None:
    """A deferred load is pending until the runner takes the arrivals, which starts it then (once the forward
    pass has queued its own uploads), once."""
    arrivals = KVArrivals(7, torch.device("cpu"), groups=3)
    started: list[int] = []
    arrivals.defer(lambda: started.append(1))
    arrivals.defer(lambda: started.append(2))
    assert arrivals.pending() and started == []
    assert arrivals.take() is None  # on CPU the copies are done when they are queued: nothing to wait for
    assert started == [1, 2] and not arrivals.pending()
    arrivals.take()
    assert started == [1, 2]
