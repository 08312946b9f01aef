"""Byte units, one definition each."""

from __future__ import annotations

GiB = 1 << 30  # memory sizes in logs and sizing (binary)
GB = 10**9  # fields whose unit is "GB" (decimal), e.g. cache.kv_size_gb
MB = 10**6  # fields whose unit is "MB" (decimal), e.g. cache.l2.load_batch_mb
