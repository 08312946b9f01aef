"""The tiers' parts from the config: `cache.chunk_tokens`, `cache.l1`, `cache.l2`, and the key namespace from the
model the runner loaded (factory.py puts them together once the runner knows its KV layout)."""

from __future__ import annotations

import hashlib
import json
import os

import attrs

from xrt.config import L2Backend, XrtConfig
from xrt.kvcache.device import DeviceKVCache, KVArrivals, KVLayout
from xrt.kvcache.sizing import host_available_bytes
from xrt.kvstore.chunk import ChunkLayout
from xrt.kvstore.copy import ChunkCopier
from xrt.kvstore.keys import KeyNamespace, checkpoint_digest
from xrt.kvstore.l1 import L1Cache
from xrt.kvstore.l2 import L2Store
from xrt.kvstore.l2_objects import ObjStore
from xrt.models.checkpoint import cache_dir
from xrt.units import GB, GiB


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


def l1_memory_problem(size_gb: float, ranks: int = 1) -> tuple[str, str] | None:
    """cache.l1.size_gb on `ranks` ranks of this host against the host memory available now (preflight.py, and
    build_l1 for this rank alone)."""
    available, need = host_available_bytes(), size_gb * GB * ranks
    if available is None or need <= available:
        return None
    each = f" on each of {ranks} ranks of this host" if ranks > 1 else ""
    each += f" ({need / GiB:.2f} GiB)"
    return ("cache.l1.size_gb", f"{size_gb} GB of host memory{each} is more than the {available / GiB:.2f} GiB "
                                f"available; lower cache.l1.size_gb")


def build_l1(cfg: XrtConfig, layout: ChunkLayout) -> L1Cache:
    # Checked again here for callers that never ran the CLI's preflight (`LLM(cfg)`): this rank's share only, as
    # the other ranks of the host may have allocated theirs already.
    problem = l1_memory_problem(cfg.cache.l1.size_gb)
    if problem is not None:
        raise ValueError(": ".join(problem))
    return L1Cache(layout, int(cfg.cache.l1.size_gb * GB))


def l2_root(cfg: XrtConfig) -> str:
    """The file store's directory; with OBJ, the key prefix in the bucket (as given: no default)."""
    if cfg.cache.l2.backend is L2Backend.OBJ:
        return cfg.cache.l2.path
    return os.path.expanduser(cfg.cache.l2.path) if cfg.cache.l2.path else os.path.join(cache_dir(), "kv")


def build_l2(cfg: XrtConfig, namespace: KeyNamespace, l1: L1Cache) -> L2Store | ObjStore:
    """Files through POSIX / GDS / GDS_MT, objects through OBJ (l2_objects.py): the same interface."""
    if cfg.cache.l2.backend is L2Backend.OBJ:
        return ObjStore(cfg.cache.l2, l2_root(cfg), namespace.hex(), l1)
    return L2Store(cfg.cache.l2, l2_root(cfg), namespace.hex(), l1)


def build_copier(cfg: XrtConfig, kv_cache: DeviceKVCache, arrivals: KVArrivals | None = None) -> ChunkCopier:
    """The copies between the KV pages and L1 slots (cache.l1's copy kernels); `arrivals`: the next forward pass
    waits per layer group of a load (rank 0's; the other ranks' loads are waited for whole)."""
    l1 = cfg.cache.l1
    return ChunkCopier(kv_cache.tensor, arrivals, store_programs=l1.store_programs, load_programs=l1.load_programs)
