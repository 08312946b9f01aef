"""L2 in object storage (cache.l2.backend=OBJ) through a real NIXL OBJ agent against a real S3 endpoint on
127.0.0.1 (moto's server, started here): greedy outputs equal cache=gpu's, the chunks land as whole objects named
by key and crc32, a new engine and a new process find them in the bucket and load them, and two processes
writing one bucket leave it consistent."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from kvstore_support import (
    CHUNK,
    child_result,
    computed_keys,
    generate_each,
    kill_left,
    reference,
    settle,
    spawn_child,
    tail,
    tier_cache,
    tiers_of,
    tokens,
)
from obj_support import PREFIX, S3, bucket_chunks, obj_cache, s3_endpoint  # noqa: F401  (the s3 fixture)

from xrt.config import KVTiers, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.connector import GPU, L1, L2
from xrt.kvstore.l2_objects import ObjStore


def obj_engine(make_cfg: Callable[..., XrtConfig], s3: S3, **sizes: int) -> LLM:
    return LLM(make_cfg(cache=obj_cache(tier_cache(KVTiers.L1_L2, "", **sizes), s3)))


def test_obj_outputs_equal_gpu_and_a_new_engine_loads_them(diverse_cfg: Callable[..., XrtConfig], s3: S3) -> None:
    """Engine A stores two prefixes (4 and 2 chunks) as objects and closes; engine B, new, lists them at its start
    and reads them back under other tails: every output is cache=gpu's, B's prefixes come from L2 exactly."""
    rng = random.Random(27)
    p1, p2 = tokens(rng, 4 * CHUNK + 3), tokens(rng, 2 * CHUNK)
    first = [p1 + tail(rng, 0, 5), p2 + tail(rng, 1, 7)]
    second = [p1 + tail(rng, 2, 4), p2 + tail(rng, 3, 6)]
    want = reference(diverse_cfg, first + second)

    a = obj_engine(diverse_cfg, s3)
    tiers = tiers_of(a)
    assert isinstance(tiers.l2, ObjStore) and tiers.l2.error is None
    assert generate_each(a, first) == want[:2]
    settle(tiers, close=True)
    stored = bucket_chunks(s3)
    assert set(stored) == computed_keys([p + o for p, o in zip(first, want[:2], strict=True)], tiers.namespace)
    assert tiers.stats.stored_l2 == len(stored)

    b = obj_engine(diverse_cfg, s3)
    assert generate_each(b, second) == want[2:]
    stats = tiers_of(b).stats
    assert stats.hit_tokens == {GPU: 0, L1: 0, L2: 6 * CHUNK} and stats.failed_loads == 0
    assert stats.checksum_failures == 0
    assert b.engine.num_prefill_tokens == sum(map(len, second)) - 6 * CHUNK
    settle(tiers_of(b), close=True)
    after = bucket_chunks(s3)
    assert {k: after[k] for k in stored} == stored  # A's objects are still there, unchanged


def test_a_new_process_gets_l2_hits_while_two_processes_write_one_bucket(
    diverse_cfg: Callable[..., XrtConfig], tiny_checkpoint_diverse: str, s3: S3, tmp_path: Path
) -> None:
    """This process stores prefix S; a new process, started on the bucket, meets S under another tail and loads
    all of it from the bucket; then both write prefix T's chunks at once (the child released as this process
    starts): every output is cache=gpu's and the bucket holds exactly one whole, verified object per chunk."""
    rng = random.Random(28)
    s_prefix, t_prefix = tokens(rng, 3 * CHUNK), tokens(rng, 2 * CHUNK + 1)
    mine = [s_prefix + tail(rng, 0, 5), t_prefix + tail(rng, 1, 4)]
    child = [s_prefix + tail(rng, 2, 3), t_prefix + tail(rng, 3, 6)]
    want = reference(diverse_cfg, mine + child)
    a = obj_engine(diverse_cfg, s3)
    assert generate_each(a, mine[:1]) == want[:1]
    settle(tiers_of(a))
    go = tmp_path / "go"
    spec = {"checkpoint": tiny_checkpoint_diverse, "l2_path": PREFIX, "obj": s3.params(), "prompts": child,
            "out": str(tmp_path / "child.json"), "ready": str(tmp_path / "ready"), "go": str(go)}
    proc = spawn_child(spec, tmp_path / "child.spec")
    try:
        while not Path(spec["ready"]).exists() and proc.poll() is None:
            time.sleep(0.01)
        go.touch()
        assert generate_each(a, mine[1:]) == want[1:2]
        settle(tiers_of(a), close=True)
        got = child_result(proc, spec)
    finally:
        kill_left([proc])
    assert got["outputs"] == want[2:]
    hits = got["stats"]["hit_tokens"]
    # S's 3 chunks came from the bucket; T's 2 did too if this process had stored them by the child's lookup
    assert hits[GPU] == hits[L1] == 0 and hits[L2] in (3 * CHUNK, 5 * CHUNK), hits
    assert got["stats"]["checksum_failures"] == 0 and got["stats"]["failed_loads"] == 0
    ns = tiers_of(a).namespace
    assert set(bucket_chunks(s3)) == computed_keys([p + o for p, o in zip(mine + child, want, strict=True)], ns)
