"""A chunk's key names its whole context, not only its own tokens (issue 23 item 8): the same CHUNK tokens after
another prefix, or at another position (in another prompt or repeated within one), are another chunk, stored and
found under a key of their own. If they shared a key, a tier would hand one context's KV to another (K and V
depend on every token before them, and on the position through RoPE): the outputs would change, and
cached_tokens would count the chunk as found where it was never computed.

Engine level: the tiny model on CPU (tests/conftest.py diverse_cfg, whose greedy tokens follow the whole
context), cache=l1, chunks of 16 tokens, judged by public behaviour only (RequestOutput.cached_tokens and
token_ids, LLM.stats()); the reference is cache=gpu. The GPU prefix cache is emptied by a filler prompt that
takes every one of its pages (no engine internals). Key level: xrt/kvstore/keys.py against sha256 chained by
hand, as its docstring defines the key."""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from kvstore_support import CHUNK, SAMPLING, reference, tail, tier_cache, tokens

from xrt.config import KVTiers, XrtConfig
from xrt.engine.llm import LLM
from xrt.engine.outputs import RequestOutput
from xrt.kvstore.keys import ChunkKeyCache, KeyNamespace, chain_keys, chunk_keys

PAGE = 4
PAGES = 32  # GPU KV cache of 128 tokens: one filler prompt takes every page, evicting every prefix-cache key


def _tiered(make_cfg: Callable[..., XrtConfig], tmp_path: Path) -> LLM:
    return LLM(make_cfg(cache=attrs.evolve(tier_cache(KVTiers.L1, tmp_path), num_pages=PAGES)))


def _run(llm: LLM, prompt: list[int]) -> RequestOutput:
    (out,) = llm.generate([prompt], SAMPLING, use_tqdm=False)
    return out


def _evict_gpu(llm: LLM, rng: random.Random) -> None:
    """Empties the GPU prefix cache the way a workload does: a prompt that, with its output, needs every page
    (allocation takes the least recently freed pages first and drops their keys). The tests check it worked:
    the next prompt's cached_tokens["gpu"] is 0."""
    out = _run(llm, tokens(rng, PAGES * PAGE - SAMPLING.max_tokens))
    assert out.finish_reason == "length" and len(out.token_ids) == SAMPLING.max_tokens


def _stored_l1(llm: LLM) -> int:
    return int(llm.stats()["tiers"].as_dict()["stored_chunks_l1"])


def _from(gpu: int = 0, l1: int = 0) -> dict[str, int]:
    return {"gpu": gpu, "l1": l1, "l2": 0}


# ---------------------------------------------------------------- engine level


def test_a_chunk_after_another_prefix_is_not_found_under_the_first(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path
) -> None:
    """A+X, then B+X with B in L1 (from B+Y) and X (32 tokens, two chunks) in L1 after A: B+X finds B and not X.
    Once B+X was computed it has chunks of its own: A+X and B+X each find all three."""
    rng = random.Random(21)
    a, b, x, y = tokens(rng, CHUNK), tokens(rng, CHUNK), tokens(rng, 2 * CHUNK), tokens(rng, 2 * CHUNK)
    ax, by, bx, ax2, bx2 = (a + x + tail(rng, 0, 5), b + y + tail(rng, 1, 5), b + x + tail(rng, 2, 5),
                            a + x + tail(rng, 3, 7), b + x + tail(rng, 4, 3))
    want = reference(diverse_cfg, [ax, by, bx, ax2, bx2])
    assert len({tuple(w) for w in want}) > 1  # the outputs follow the context: a wrong KV would show

    llm = _tiered(diverse_cfg, tmp_path)
    got = [_run(llm, ax), _run(llm, by)]
    assert [o.cached_tokens for o in got] == [_from(), _from()]
    assert _stored_l1(llm) == 6  # A, A+X1, A+X2; B, B+Y1, B+Y2

    _evict_gpu(llm, rng)
    got.append(_run(llm, bx))
    # B from L1; X after B is not the X after A, though its tokens are
    assert got[-1].cached_tokens == _from(l1=CHUNK)

    for p in (ax2, bx2):
        _evict_gpu(llm, rng)
        got.append(_run(llm, p))
        assert got[-1].cached_tokens == _from(l1=3 * CHUNK)  # every whole chunk, from its own context
    assert [o.token_ids for o in got] == want


def test_a_chunk_after_another_prefix_is_missed_after_a_gpu_hit(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path
) -> None:
    """The same without eviction: the GPU prefix cache serves B's pages, and the tiers, asked for what follows
    them, do not take X's chunks stored after A."""
    rng = random.Random(22)
    a, b, x = tokens(rng, CHUNK), tokens(rng, CHUNK), tokens(rng, 2 * CHUNK)
    ax, by, bx = a + x + tail(rng, 0, 5), b + tokens(rng, 2 * CHUNK) + tail(rng, 1, 5), b + x + tail(rng, 2, 5)
    want = reference(diverse_cfg, [ax, by, bx])
    llm = _tiered(diverse_cfg, tmp_path)
    got = [_run(llm, p) for p in (ax, by, bx)]
    assert got[2].cached_tokens == _from(gpu=CHUNK)
    assert [o.token_ids for o in got] == want


def test_a_chunk_at_another_position_is_another_chunk(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """X stored at offset 16 (after A) is not found at offset 0 (X+T), nor at an offset that is not a chunk
    boundary (8 tokens, then X: other chunk contents, and nothing found)."""
    rng = random.Random(23)
    a, x = tokens(rng, CHUNK), tokens(rng, 2 * CHUNK)
    ax, x0, x8 = a + x + tail(rng, 0, 5), x + tail(rng, 1, 5), a[:8] + x + tail(rng, 2, 5)
    x0_again = x + tail(rng, 3, 9)
    want = reference(diverse_cfg, [ax, x0, x8, x0_again])

    llm = _tiered(diverse_cfg, tmp_path)
    got = [_run(llm, ax)]
    for p in (x0, x8):
        _evict_gpu(llm, rng)
        got.append(_run(llm, p))
        assert got[-1].cached_tokens == _from(), len(p)
    _evict_gpu(llm, rng)
    got.append(_run(llm, x0_again))  # X at offset 0 has its own chunks now
    assert got[-1].cached_tokens == _from(l1=2 * CHUNK)
    assert [o.token_ids for o in got] == want


def test_a_chunk_repeated_within_a_prompt_is_stored_once_per_position(
    diverse_cfg: Callable[..., XrtConfig], tmp_path: Path
) -> None:
    """A+Y+Y: chunks 1 and 2 hold the same tokens at positions 16 and 32, so their KV differs (RoPE, and what
    came before). Both are stored (3 chunks, not 2) and come back to the right place: a prompt with that prefix
    loads all three from L1 and generates cache=gpu's tokens. Y+Y at offset 0 finds nothing of them."""
    rng = random.Random(24)
    a, y = tokens(rng, CHUNK), tokens(rng, CHUNK)
    ayy, ayy2, yy = a + y + y + tail(rng, 0, 5), a + y + y + tail(rng, 1, 8), y + y + tail(rng, 2, 5)
    want = reference(diverse_cfg, [ayy, ayy2, yy])

    llm = _tiered(diverse_cfg, tmp_path)
    got = [_run(llm, ayy)]
    assert _stored_l1(llm) == 3
    _evict_gpu(llm, rng)
    got.append(_run(llm, ayy2))
    assert got[-1].cached_tokens == _from(l1=3 * CHUNK)
    _evict_gpu(llm, rng)
    got.append(_run(llm, yy))
    assert got[-1].cached_tokens == _from()
    assert [o.token_ids for o in got] == want


# ---------------------------------------------------------------- key level (xrt/kvstore/keys.py)

NS = KeyNamespace(model="dummy:key-context", dtype="float32", num_layers=3, page_size=4, num_kv_heads=2,
                  head_dim=16, tp_rank=0, tp_size=1, chunk_tokens=8)


def _by_hand(token_ids: list[int], ns: KeyNamespace) -> list[bytes]:
    """The keys as keys.py's docstring defines them, one hashlib call per chunk: key_i = sha256(key_{i-1} +
    chunk i's ids as int64 little-endian), key_{-1} = the namespace's digest."""
    n = ns.chunk_tokens
    parent = ns.digest()
    out = []
    for start in range(0, len(token_ids) // n * n, n):
        parent = hashlib.sha256(parent + struct.pack(f"<{n}q", *token_ids[start : start + n])).digest()
        out.append(parent)
    return out


def test_keys_are_sha256_chained_over_the_prefix() -> None:
    rng = random.Random(5)
    ids = [rng.randrange(0, 2**40) for _ in range(5 * NS.chunk_tokens + 3)]  # ids past 32 bits: int64, not int32
    assert chunk_keys(ids, NS) == _by_hand(ids, NS)


@pytest.mark.parametrize("offset_chunks", [0, 1, 3])
def test_the_same_chunk_after_other_prefixes_gets_other_keys(offset_chunks: int) -> None:
    n = NS.chunk_tokens
    rng = random.Random(offset_chunks)
    x = [rng.randrange(3, 2000) for _ in range(2 * n)]
    a = [rng.randrange(3, 2000) for _ in range(offset_chunks * n)]
    b = [rng.randrange(3, 2000) for _ in range(offset_chunks * n)]
    ka, kb = chunk_keys(a + x, NS)[offset_chunks:], chunk_keys(b + x, NS)[offset_chunks:]
    assert len(ka) == len(kb) == 2
    if offset_chunks:
        assert not set(ka) & set(kb)  # another prefix of the same length: every key of X differs
    else:
        assert ka == kb  # no prefix at all on either side: the same context, the same keys
    # the same prefix (an equal list, another object) gives the same keys, also through the engine's key cache
    assert chunk_keys(list(a) + list(x), NS)[offset_chunks:] == ka
    cache = ChunkKeyCache(NS)
    assert cache.keys(a + x, offset_chunks + 2)[offset_chunks:] == ka
    assert cache.keys(b + x, offset_chunks + 2)[offset_chunks:] == kb
    # chaining on from the prefix's last key is what keying the whole prompt gives
    parent = chunk_keys(a, NS)[-1] if a else NS.digest()
    assert chain_keys(parent, x, n) == ka == _by_hand(a + x, NS)[offset_chunks:]


def test_the_same_chunk_at_other_positions_gets_other_keys() -> None:
    """One chunk of tokens repeated: at offset 0, 8 and 16 of one prompt, and at offset 0 of another: four keys,
    while an identical prompt repeats all of them."""
    n = NS.chunk_tokens
    y = list(range(500, 500 + n))
    keys = chunk_keys(y * 3, NS)
    assert len(set(keys)) == 3
    assert chunk_keys(y, NS) == keys[:1]
    shifted = chunk_keys([7] * n + y * 2, NS)  # y at offsets 8 and 16 after another first chunk
    assert not set(shifted[1:]) & set(keys)
    assert chunk_keys(y * 3, NS) == keys


def test_a_prefix_that_differs_in_one_token_changes_every_later_key() -> None:
    n = NS.chunk_tokens
    rng = random.Random(9)
    ids = [rng.randrange(3, 2000) for _ in range(4 * n)]
    for pos in (0, n - 1, n, 3 * n - 1):
        other = list(ids)
        other[pos] += 1
        ka, kb = chunk_keys(ids, NS), chunk_keys(other, NS)
        changed = pos // n
        assert ka[:changed] == kb[:changed], pos
        assert all(p != q for p, q in zip(ka[changed:], kb[changed:], strict=True)), pos
