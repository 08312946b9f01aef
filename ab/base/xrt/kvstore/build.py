"""The tiers from the config: `cache.chunk_tokens`, `cache.l1`, `cache.l2`, and the key namespace from the model
the runner loaded. The engine calls these once it knows the KV layout (after the runner is built)."""

from __future__ import annotations

import hashlib
import json
import os

import attrs

from xrt.config import KVTiers, XrtConfig
from xrt.kvcache.device import DeviceKVCache, KVArrivals, KVLayout
from xrt.kvstore.chunk import ChunkLayout
from xrt.kvstore.copy import ChunkCopier
from xrt.kvstore.keys import KeyNamespace, checkpoint_digest
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.peers import TierPeers
from xrt.kvstore.tiered import TieredKVCacheManager
from xrt.models.checkpoint import cache_dir
from xrt.units import GB


def key_namespace(cfg: XrtConfig, kv: KVLayout, checkpoint_dir: str | None, tp_rank: int,
                  tp_size: int) -> KeyNamespace:
    """Dummy weights are a function of the shape and the seed, so those name the model; a checkpoint is named
    by its files (keys.checkpoint_digest)."""
    if checkpoint_dir is None:
        shape = json.dumps(attrs.asdict(cfg.model, value_serializer=lambda _i, _a, v: getattr(v, "value", v)),
                           sort_keys=True)
        model = f"dummy:{hashlib.sha256(shape.encode()).hexdigest()}:seed={cfg.seed}"
    else:
        model = checkpoint_digest(checkpoint_dir)
    return KeyNamespace(model=model, dtype=str(kv.dtype).removeprefix("torch."), num_layers=kv.num_layers,
                        page_size=kv.page_size, num_kv_heads=kv.num_kv_heads, head_dim=kv.head_dim,
                        tp_rank=tp_rank, tp_size=tp_size, chunk_tokens=cfg.cache.chunk_tokens)


def chunk_layout(cfg: XrtConfig, kv: KVLayout) -> ChunkLayout:
    return ChunkLayout(kv, cfg.cache.chunk_tokens)


def build_l1(cfg: XrtConfig, layout: ChunkLayout) -> L1Cache:
    return L1Cache(layout, int(cfg.cache.l1.size_gb * GB))


def l2_root(cfg: XrtConfig) -> str:
    return os.path.expanduser(cfg.cache.l2.path) if cfg.cache.l2.path else os.path.join(cache_dir(), "kv")


def build_l2(cfg: XrtConfig, namespace: KeyNamespace, l1: L1Cache) -> L2Store:
    return L2Store(cfg.cache.l2, l2_root(cfg), namespace.hex(), l1)


def build_tiered(cfg: XrtConfig, kv_cache: DeviceKVCache, checkpoint_dir: str | None,
                 peers: TierPeers | None = None) -> TieredKVCacheManager:
    """The KV manager for cache.tiers=l1 / l1_l2 over the runner's device KV cache: rank 0's with parallel.tp
    > 1 (its namespace is tp_rank 0's; `peers` reaches the other ranks' shards, shard.py)."""
    kv = kv_cache.layout
    layout = chunk_layout(cfg, kv)
    namespace = key_namespace(cfg, kv, checkpoint_dir, 0, cfg.parallel.tp)
    l1 = build_l1(cfg, layout)
    l2 = build_l2(cfg, namespace, l1) if cfg.cache.tiers is KVTiers.L1_L2 else None
    return TieredKVCacheManager(kv_cache.num_pages, kv.page_size, build_copier(cfg, kv_cache, kv_cache.arrivals),
                                layout, namespace, l1, l2, cfg.cache, peers)


def build_copier(cfg: XrtConfig, kv_cache: DeviceKVCache, arrivals: KVArrivals | None = None) -> ChunkCopier:
    """The copies between the KV pages and L1 slots (cache.l1's copy kernels); `arrivals`: the next forward pass
    waits per layer group of a load (rank 0's; the other ranks' loads are waited for whole)."""
    l1 = cfg.cache.l1
    return ChunkCopier(kv_cache.tensor, arrivals, store_programs=l1.store_programs, load_programs=l1.load_programs)
