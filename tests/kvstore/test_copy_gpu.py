"""GPU pages <-> pinned L1 slots on the side stream (xrt/kvstore/copy.py), and L2 through NIXL from a pinned
L1. Written on a CPU machine and not run there: the first GPU run checks it (tests/README.md: --gpu)."""

from __future__ import annotations

from pathlib import Path

import torch
from kvstore_support import LAYOUT, key

from xrt.config import L2Args
from xrt.kvstore.copy import ChunkCopier
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store


def test_gather_scatter_on_the_side_stream(device: torch.device, tmp_path: Path) -> None:
    kv = torch.randn((LAYOUT.kv.num_layers, 12, 2, 4, 2, 8), device=device).to(LAYOUT.kv.dtype)
    l1 = L1Cache(LAYOUT, 4 * LAYOUT.nbytes)
    assert l1.buffer.is_pinned()
    copier = ChunkCopier(kv)
    slot = l1.reserve(key(0))
    # the compute stream writes page 5 just before the gather: the side stream must see it
    kv[:, 5].fill_(3.0)
    done = copier.gather([5, 2], l1.slot_view(slot))
    assert isinstance(done, torch.cuda.Event)
    done.synchronize()
    l1.publish(slot)
    view = l1.slot_view(slot)
    assert torch.equal(view[:, 0], kv[:, 5].cpu()) and torch.equal(view[:, 1], kv[:, 2].cpu())

    l2 = L2Store(L2Args(), tmp_path, "ab" * 32, l1)
    assert l2.store([(key(0), slot, None)]) == [key(0)]
    other = l1.reserve(key(1))
    assert l2.load([(key(0), other)]).crcs[0] is not None
    l1.publish(other)
    before = kv.clone()
    done = copier.scatter(l1.slot_view(other), [0, 11])
    torch.cuda.current_stream(device).wait_event(done)
    assert torch.equal(kv[:, 0], before[:, 5]) and torch.equal(kv[:, 11], before[:, 2])
    assert torch.equal(kv[:, 1:11], before[:, 1:11])
    l2.close()
