"""The KV tier messages as flat int64 (like wire.py's steps): a 32-byte chunk key is 4 int64 (little-endian
bytes), and every chunk of a message has the same number of pages (a chunk is whole pages), so a message is a
few columns.

KV_STORE:  [n, pages_per_chunk, keys (4 n), pages (n x pages_per_chunk)]
KV_LOOKUP: [n, keys (4 n)]  (KV_PREFETCH too)
KV_LOAD:   [n, pages_per_chunk, deadline (us per L2 read batch, 0: none), keys (4 n), skips (n),
           pages (n x pages_per_chunk)]"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xrt.kvstore.peers import LoadChunk, StoreChunk

KEY_BYTES = 32
KEY_INTS = KEY_BYTES // 8


def _keys(keys: Sequence[bytes]) -> np.ndarray:
    if any(len(k) != KEY_BYTES for k in keys):
        raise ValueError(f"chunk keys are {KEY_BYTES} bytes")
    return np.frombuffer(b"".join(keys), dtype="<i8").astype(np.int64)


def _unkeys(p: np.ndarray, n: int) -> list[bytes]:
    raw = np.ascontiguousarray(p[: KEY_INTS * n], dtype="<i8").tobytes()
    return [raw[i * KEY_BYTES : (i + 1) * KEY_BYTES] for i in range(n)]


def _pages(chunks: Sequence[tuple[bytes, Sequence[int]]] | Sequence[LoadChunk]) -> tuple[int, np.ndarray]:
    ppc = len(chunks[0][1]) if chunks else 0
    pages = np.array([list(c[1]) for c in chunks], dtype=np.int64).reshape(len(chunks), ppc)
    return ppc, pages.reshape(-1)


def encode_kv_store(chunks: Sequence[StoreChunk]) -> np.ndarray:
    ppc, pages = _pages(chunks)
    return np.concatenate((np.array([len(chunks), ppc], dtype=np.int64), _keys([k for k, _ in chunks]), pages))


def decode_kv_store(p: np.ndarray) -> list[StoreChunk]:
    n, ppc = int(p[0]), int(p[1])
    keys = _unkeys(p[2:], n)
    pages = p[2 + KEY_INTS * n : 2 + KEY_INTS * n + n * ppc].reshape(n, ppc).tolist()
    return list(zip(keys, pages, strict=True))


def encode_kv_lookup(keys: Sequence[bytes]) -> np.ndarray:
    return np.concatenate((np.array([len(keys)], dtype=np.int64), _keys(keys)))


def decode_kv_lookup(p: np.ndarray) -> list[bytes]:
    return _unkeys(p[1:], int(p[0]))


def encode_kv_load(chunks: Sequence[LoadChunk], deadline_s: float | None = None) -> np.ndarray:
    ppc, pages = _pages(chunks)
    deadline_us = max(1, round(deadline_s * 1e6)) if deadline_s is not None else 0
    head = np.array([len(chunks), ppc, deadline_us], dtype=np.int64)
    skips = np.array([s for _, _, s in chunks], dtype=np.int64)
    return np.concatenate((head, _keys([k for k, _, _ in chunks]), skips, pages))


def decode_kv_load(p: np.ndarray) -> tuple[list[LoadChunk], float | None]:
    """The chunks, and the deadline of each L2 read batch in seconds (None: no deadline)."""
    n, ppc, deadline_us = int(p[0]), int(p[1]), int(p[2])
    at = 3 + KEY_INTS * n
    keys = _unkeys(p[3:], n)
    skips = p[at : at + n].tolist()
    pages = p[at + n : at + n + n * ppc].reshape(n, ppc).tolist()
    return list(zip(keys, pages, skips, strict=True)), (deadline_us / 1e6 if deadline_us else None)
