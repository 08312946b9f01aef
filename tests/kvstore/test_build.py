"""The tiers built from a composed config (xrt/kvstore/build.py)."""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from xrt import load_config
from xrt.kvcache.device import KVLayout
from xrt.kvstore.build import build_l1, build_l2, chunk_layout, key_namespace

KV = KVLayout(num_layers=2, page_size=16, num_kv_heads=2, head_dim=16, dtype=torch.float32)


def test_built_from_config(tmp_path: Path) -> None:
    cfg = load_config(["cache.chunk_tokens=32", "cache.l1.size_gb=0.0001", f"cache.l2.path={tmp_path}"])
    layout = chunk_layout(cfg, KV)
    assert layout.pages_per_chunk == 2 and layout.nbytes == 2 * KV.bytes_per_page
    l1 = build_l1(cfg, layout)
    assert l1.num_slots == int(0.0001e9) // layout.nbytes
    ns = key_namespace(cfg, KV, None, 0, 1)
    l2 = build_l2(cfg, ns, l1)
    assert l2.dir.parent == tmp_path and ns.hex()[:32] in l2.dir.name and l2.backend == "POSIX"


def test_dummy_namespace_follows_shape_and_seed() -> None:
    cfg = load_config([])
    ns = key_namespace(cfg, KV, None, 0, 1)
    assert ns == key_namespace(load_config([]), KV, None, 0, 1)
    assert ns != key_namespace(attrs.evolve(cfg, seed=1), KV, None, 0, 1)
    assert ns != key_namespace(load_config(["model.intermediate_size=96"]), KV, None, 0, 1)
    assert ns != key_namespace(cfg, KV, None, 1, 2)
