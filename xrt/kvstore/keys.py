"""Chunk keys: which stored KV chunk holds a prompt's tokens.

A chunk is `cache.chunk_tokens` tokens; chunk i's key is sha256(namespace, key of chunk i-1, token ids of chunk
i), so a key names the whole prefix up to its chunk's end and two prompts sharing a prefix share its keys.
sha256, never Python's `hash()`: L2 outlives the process and is shared between processes, and `hash()` of
strings is salted per process (PYTHONHASHSEED). The namespace is everything that makes the same tokens produce
other bytes: the model (checkpoint hash, or the shape and seed for dummy weights), dtype, page layout, tensor
parallel rank and size, and `FORMAT_VERSION` (raise it when the chunk's byte layout changes)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

# The chunk's byte layout (chunk.py: [layers, pages, 2, page_size, kv_heads, head_dim]) and this key scheme.
FORMAT_VERSION = 1
# How a checkpoint is identified: these files' bytes (the weights and the shape they are read with).
CHECKPOINT_FILES = ("config.json", "*.safetensors")


@attrs.frozen
class KeyNamespace:
    """Everything besides the tokens that decides a chunk's bytes."""

    model: str  # checkpoint_digest(dir), or "dummy:<shape and seed>" for dummy weights
    dtype: str
    num_layers: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    tp_rank: int
    tp_size: int
    chunk_tokens: int
    version: int = FORMAT_VERSION

    def digest(self) -> bytes:
        """32 bytes naming the namespace; sorted JSON so field order never changes it."""
        return hashlib.sha256(json.dumps(attrs.asdict(self), sort_keys=True).encode()).digest()

    def hex(self) -> str:
        return self.digest().hex()


def checkpoint_digest(checkpoint_dir: str | Path) -> str:
    """sha256 over the names, sizes and first/last MiB of the checkpoint's config and weight files: reading
    every byte of a 60 GB checkpoint at start costs minutes, and a changed file changes its size or its ends
    in practice (safetensors put the header first). Names are sorted so listing order does not matter."""
    d = Path(checkpoint_dir)
    h = hashlib.sha256()
    mib = 1 << 20
    for pattern in CHECKPOINT_FILES:
        for p in sorted(d.glob(pattern)):
            size = p.stat().st_size
            h.update(f"{p.name}\0{size}\0".encode())
            with p.open("rb") as f:
                h.update(f.read(mib))
                if size > 2 * mib:
                    f.seek(size - mib)
                    h.update(f.read(mib))
    return h.hexdigest()


def chunk_keys(token_ids: Sequence[int], namespace: KeyNamespace) -> list[bytes]:
    """The chained key of every *full* chunk of `token_ids` (a partial tail chunk has no key: it is not stored)."""
    n = namespace.chunk_tokens
    # int64 little-endian bytes: the same on every machine and process, and one numpy call per chunk
    ids = np.asarray(token_ids, dtype="<i8")
    parent = namespace.digest()
    keys: list[bytes] = []
    for start in range(0, len(ids) - n + 1, n):
        parent = hashlib.sha256(parent + ids[start : start + n].tobytes()).digest()
        keys.append(parent)
    return keys
