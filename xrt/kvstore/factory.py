"""The KV tiers a config asks for, over a runner's device KV cache: each rank's `TierAgent` (built by its runner),
and rank 0's connector over rank 0's agent (with parallel.tp > 1, reaching the other ranks through `sender`)."""

from __future__ import annotations

from xrt.config import XrtConfig
from xrt.kvcache.device import DeviceKVCache
from xrt.kvstore.agent import TierAgent
from xrt.kvstore.build import key_namespace
from xrt.kvstore.connector import TieredConnector
from xrt.kvstore.peers import PlanSender
from xrt.ops.parallel_state import TPState


def build_agent(cfg: XrtConfig, kv_cache: DeviceKVCache, checkpoint_dir: str | None, tp: TPState) -> TierAgent:
    """cache.tiers=l1 / l1_l2, this rank's: its namespace (and so its keys and L2 directory) is its own."""
    return TierAgent(cfg, kv_cache, key_namespace(cfg, kv_cache.layout, checkpoint_dir, tp.rank, tp.size), tp)


def build_connector(cfg: XrtConfig, agent: TierAgent, sender: PlanSender | None = None) -> TieredConnector:
    """Rank 0's, over its own agent."""
    return TieredConnector(agent, cfg.cache, sender)
