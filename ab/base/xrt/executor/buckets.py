"""Decode batch buckets for CUDA-graph replay: one graph per bucket, a batch pads up to the smallest
bucket that holds it, and a batch above the largest bucket runs eager."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from xrt.config import ExecutorArgs


def default_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to 32, then steps of 16; max_batch itself always included."""
    ladder = [1, 2, 4, 8, 16, 24, 32, *range(48, max_batch + 1, 16)]
    out = [b for b in ladder if b <= max_batch]
    if out[-1] != max_batch:
        out.append(max_batch)
    return out


@dataclass(frozen=True)
class Buckets:
    sizes: tuple[int, ...]  # ascending, unique, all >= 1

    @classmethod
    def from_args(cls, args: ExecutorArgs) -> Buckets:
        sizes = sorted(set(args.buckets)) if args.buckets else default_buckets(args.max_batch)
        return cls(tuple(sizes))

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def bucket_for(self, batch: int) -> int | None:
        """The smallest bucket >= batch, or None when batch is above the largest (run eager)."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        i = bisect.bisect_left(self.sizes, batch)
        return self.sizes[i] if i < len(self.sizes) else None
