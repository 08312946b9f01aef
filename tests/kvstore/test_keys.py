"""Chunk keys (xrt/kvstore/keys.py): stable across processes, namespaced, chained over prefixes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from xrt.kvstore.keys import KeyNamespace, checkpoint_digest, chunk_keys

NS = KeyNamespace(model="dummy:test", dtype="float32", num_layers=2, page_size=4, num_kv_heads=2, head_dim=8,
                  tp_rank=0, tp_size=1, chunk_tokens=8)
TOKENS = list(range(100, 140))  # 5 full chunks of 8


def test_only_full_chunks_have_keys() -> None:
    assert len(chunk_keys(TOKENS, NS)) == 5
    assert len(chunk_keys(TOKENS[:15], NS)) == 1
    assert chunk_keys(TOKENS[:7], NS) == []
    assert all(len(k) == 32 for k in chunk_keys(TOKENS, NS))


def test_same_key_in_another_process() -> None:
    """sha256, not hash(): a fresh interpreter with another hash seed computes the same keys."""
    code = (
        "from xrt.kvstore.keys import KeyNamespace, chunk_keys\n"
        f"ns = KeyNamespace(**{attrs.asdict(NS)!r})\n"
        f"print(','.join(k.hex() for k in chunk_keys({TOKENS!r}, ns)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=Path(__file__).parents[2])
    assert out.stdout.strip().split(",") == [k.hex() for k in chunk_keys(TOKENS, NS)]


def test_every_namespace_field_changes_every_key() -> None:
    base = chunk_keys(TOKENS, NS)
    for name, value in [("model", "dummy:other"), ("dtype", "bfloat16"), ("num_layers", 3), ("page_size", 8),
                        ("num_kv_heads", 4), ("head_dim", 16), ("tp_rank", 1), ("tp_size", 2), ("version", 2)]:
        other = chunk_keys(TOKENS, attrs.evolve(NS, **{name: value}))
        assert not set(other) & set(base), name


def test_prefix_chain_is_prefix_of_longer_chain() -> None:
    long = chunk_keys(TOKENS, NS)
    assert chunk_keys(TOKENS[:24], NS) == long[:3]
    assert chunk_keys(TOKENS[:27], NS) == long[:3]
    # one token changed in chunk 1: chunk 0 keeps its key, every later key changes (the chain)
    changed = TOKENS.copy()
    changed[9] += 1
    other = chunk_keys(changed, NS)
    assert other[0] == long[0] and all(a != b for a, b in zip(other[1:], long[1:], strict=True))


def test_checkpoint_digest_follows_the_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"a" * 100)
    first = checkpoint_digest(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")  # not part of the weights
    assert checkpoint_digest(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"b" * 100)
    assert checkpoint_digest(tmp_path) != first


def test_key_cache_matches_chunk_keys_as_a_list_grows() -> None:
    """ChunkKeyCache gives chunk_keys' keys for a list as it grows by appends (a sequence decoding), keeps one
    entry per list object (an equal list of other tokens never reads another's keys), and forgets."""
    import random

    from xrt.kvstore.keys import ChunkKeyCache

    ct = NS.chunk_tokens
    cache = ChunkKeyCache(NS, capacity=2)
    rng = random.Random(1)
    tokens = [rng.randrange(1000) for _ in range(2 * ct + 3)]
    assert cache.keys(tokens, 1) == chunk_keys(tokens[:ct], NS)
    assert cache.keys(tokens, 2) == chunk_keys(tokens, NS)
    tokens.extend(rng.randrange(1000) for _ in range(ct))  # a third chunk completes
    assert cache.keys(tokens, 3) == chunk_keys(tokens, NS)
    other = list(tokens)
    other[5] += 1  # the same length, other tokens: its own keys, never the first list's
    assert cache.keys(other, 3) == chunk_keys(other, NS) != chunk_keys(tokens, NS)
    assert cache.keys(tokens, 2) == chunk_keys(tokens, NS)[:2]
    with pytest.raises(ValueError, match="4 chunks"):
        cache.keys(tokens, 4)
    cache.forget(tokens)
    assert cache.keys(tokens, 3) == chunk_keys(tokens, NS)
    third = [rng.randrange(1000) for _ in range(ct)]
    cache.keys(third, 1)  # past capacity 2: the oldest entry goes, and every list still gets its own keys
    assert len(cache._known) == 2
    assert cache.keys(other, 3) == chunk_keys(other, NS)
