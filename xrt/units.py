"""Byte units, one definition each."""

from __future__ import annotations

GiB = 1 << 30  # memory sizes in logs and sizing (binary)
GB = 10**9  # fields whose unit is "GB" (decimal), e.g. cache.kv_size_gb
MB = 10**6  # fields whose unit is "MB" (decimal), e.g. cache.l2.load_batch_mb
kB = 10**3
# Decimal units from the largest, for sizes printed to people (the size fields' own unit is GB).
DECIMAL_UNITS = ((GB, "GB"), (MB, "MB"), (kB, "kB"))


def decimal_size(n: float) -> str:
    """`1.2 GB`, `340 MB`, `12.3 kB`, `512 B`: `n` bytes in the decimal unit that suits it, 3 significant digits."""
    for scale, unit in DECIMAL_UNITS:
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"
