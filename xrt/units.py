"""Byte units, one definition each."""

from __future__ import annotations

GiB = 1 << 30  # memory sizes in logs and sizing (binary)
GB = 10**9  # fields whose unit is "GB" (decimal), e.g. cache.kv_size_gb
