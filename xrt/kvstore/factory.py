"""The KV tiers a config asks for, over a runner's device KV cache: rank 0's connector (its own agent, and with
parallel.tp > 1 the other ranks' shards through `peers`)."""

from __future__ import annotations

from xrt.config import XrtConfig
from xrt.kvcache.device import DeviceKVCache
from xrt.kvstore.agent import TierAgent
from xrt.kvstore.build import key_namespace
from xrt.kvstore.connector import TieredConnector
from xrt.kvstore.peers import TierPeers


def build_connector(cfg: XrtConfig, kv_cache: DeviceKVCache, checkpoint_dir: str | None,
                    peers: TierPeers | None = None) -> TieredConnector:
    """cache.tiers=l1 / l1_l2; its namespace is tp_rank 0's (the workers' are their own, shard.py)."""
    namespace = key_namespace(cfg, kv_cache.layout, checkpoint_dir, 0, cfg.parallel.tp)
    return TieredConnector(TierAgent(cfg, kv_cache, namespace), cfg.cache, peers)
