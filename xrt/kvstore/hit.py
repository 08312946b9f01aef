"""`TieredHit`: a prefix hit that continues past its GPU pages into the tiers (the connector's `match`)."""

from __future__ import annotations

from dataclasses import dataclass

from xrt.kvcache.interface import PrefixHit


@dataclass(frozen=True, slots=True)
class TieredHit(PrefixHit):
    """`chunks[i]` = (chunk index, key, tier) for the chunks after the GPU part, in order; num_tokens counts them.
    skipped: an L2 run the policy would not load (counted at admission)."""

    chunks: tuple[tuple[int, bytes, str], ...] = ()
    gpu_tokens: int = 0
    skipped: bool = False
