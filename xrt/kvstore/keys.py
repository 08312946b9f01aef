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

from xrt.kvcache.by_list import ByList

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


def rank_key(digest: bytes, key: bytes) -> bytes:
    """A tensor-parallel worker's key for the chunk rank 0 keys `key` (digest: the worker's namespace digest).
    Rank 0's key names the whole prefix, the digest this rank's shard of it (tp_rank, tp_size), so two ranks' files
    never share a name nor a directory (named by the namespace too), and a restart derives the same keys."""
    return hashlib.sha256(digest + key).digest()


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
    return chain_keys(namespace.digest(), token_ids, namespace.chunk_tokens)


def chain_keys(parent: bytes, token_ids: Sequence[int], chunk_tokens: int) -> list[bytes]:
    """The keys of the full chunks of token_ids, chained on from `parent` (the namespace's digest, or the key of
    the chunk before them)."""
    n = chunk_tokens
    # int64 little-endian bytes: the same on every machine and process, and one numpy call for all of them
    ids = np.asarray(token_ids[: len(token_ids) // n * n], dtype="<i8").tobytes()
    step = 8 * n
    keys: list[bytes] = []
    for start in range(0, len(ids), step):
        parent = hashlib.sha256(parent + ids[start : start + step]).digest()
        keys.append(parent)
    return keys


class ChunkKeyCache:
    """chunk_keys of the token lists seen lately, by the list object (`ByList`): a request's prompt is keyed when it
    is queued (prefetch), looked up, and committed chunk by chunk; keying 8k tokens each time cost ~0.6 ms of host
    time (mostly converting the ids to bytes), some of it before the prefill could launch."""

    def __init__(self, namespace: KeyNamespace, capacity: int = 256) -> None:
        self.namespace = namespace
        self._digest = namespace.digest()
        self._known: ByList[list[bytes]] = ByList(lambda _: [], capacity)

    def keys(self, token_ids: list[int], num_chunks: int) -> list[bytes]:
        """The keys of the first num_chunks chunks of token_ids (all full)."""
        n = self.namespace.chunk_tokens
        if len(token_ids) < num_chunks * n:
            raise ValueError(f"{num_chunks} chunks of {n} tokens asked of {len(token_ids)} tokens")
        known = self._known.get(token_ids)
        if len(known) < num_chunks:
            parent = known[-1] if known else self._digest
            known.extend(chain_keys(parent, token_ids[len(known) * n : num_chunks * n], n))
        return known[:num_chunks]

    def forget(self, token_ids: list[int]) -> None:
        """Drop the list's entry (its sequence let go of its pages)."""
        self._known.forget(token_ids)
