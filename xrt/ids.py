"""Token ids (Python ints) as int64 bytes and arrays and back: conversions the host makes on the way to a first
token (the pipe to the engine's process, the prefix cache's page keys, a step's staging)."""

from __future__ import annotations

import struct
from array import array

import numpy as np


def int64_bytes(ids: list[int]) -> bytes:
    """ids as native int64 bytes. `struct.pack` takes the ints as arguments, about twice as fast as
    `array("q", ids)` or `np.asarray(ids)`, which go through the list's iterator."""
    return struct.pack(f"{len(ids)}q", *ids)


def int64_array(ids: list[int]) -> np.ndarray:
    """ids as a read-only int64 numpy array (over `int64_bytes`)."""
    return np.frombuffer(int64_bytes(ids), dtype=np.int64)


def int64_list(data: bytes) -> list[int]:
    """`int64_bytes` back to a list."""
    return array("q", data).tolist()
