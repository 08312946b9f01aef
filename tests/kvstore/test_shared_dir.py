"""Two engines in two processes storing into one L2 directory at once, with prefixes both share and prefixes
each has alone: afterwards the directory holds exactly the chunks both computed, each file whole and matching
its checksum, the index listing exactly the files, no temp file left; a third engine reads them back."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from kvstore_support import (
    CHUNK,
    check_l2_dir,
    child_result,
    computed_keys,
    generate_each,
    kill_left,
    load_all,
    namespace_dir,
    reference,
    settle,
    spawn_child,
    tail,
    tier_cache,
    tiers_of,
    tokens,
)

from xrt.config import KVTiers, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.connector import GPU, L1, L2


def test_two_processes_store_into_one_directory(
    diverse_cfg: Callable[..., XrtConfig], tiny_checkpoint_diverse: str, tmp_path: Path
) -> None:
    rng = random.Random(21)
    shared = [tokens(rng, 3 * CHUNK + 2), tokens(rng, 2 * CHUNK), tokens(rng, 4 * CHUNK + 9)]
    j = iter(range(40))
    prompts = []
    for _ in range(2):  # per process: the shared prefixes in its own order, its own prompts between them
        own = [tokens(rng, 3 * CHUNK + 7), tokens(rng, 5 * CHUNK + 1)]
        mine = [shared[0], own[0], shared[2], shared[1], own[1], shared[0]]
        rng.shuffle(mine)
        prompts.append([p + tail(rng, next(j), rng.randrange(1, 12)) for p in mine])

    go = tmp_path / "go"
    specs = [
        {
            "checkpoint": tiny_checkpoint_diverse,
            "l2_path": str(tmp_path / "l2"),
            "prompts": prompts[i],
            "out": str(tmp_path / f"out{i}.json"),
            "ready": str(tmp_path / f"ready{i}"),
            "go": str(go),
            "index_read_delay": 0.01,
        }
        for i in range(2)
    ]
    procs = [spawn_child(s, tmp_path / f"spec{i}.json") for i, s in enumerate(specs)]
    try:
        want = reference(diverse_cfg, prompts[0] + prompts[1])  # while the children start
        deadline = time.monotonic() + 120
        while not all(Path(s["ready"]).exists() for s in specs):  # both engines built: start them together
            assert all(p.poll() is None for p in procs), "a child died"
            assert time.monotonic() < deadline, "the children never got ready"
            time.sleep(0.01)
        go.touch()
        results = [child_result(p, s) for p, s in zip(procs, specs, strict=True)]
    finally:
        kill_left(procs)
    assert results[0]["outputs"] + results[1]["outputs"] == want
    assert all(r["stats"]["dropped_l2"] == 0 for r in results)

    d = namespace_dir(tmp_path / "l2")
    entries = check_l2_dir(d)  # before an engine opens it: nothing was cleaned up for us
    llm = LLM(diverse_cfg(cache=tier_cache(KVTiers.L1_L2, tmp_path / "l2")))
    tiers = tiers_of(llm)
    seqs = [p + o for p, o in zip(prompts[0] + prompts[1], want, strict=True)]
    assert set(entries) == computed_keys(seqs, tiers.namespace)  # neither process lost the other's entries
    assert tiers.l2 is not None
    assert load_all(tiers.l2) == entries and tiers.l2.corrupt == 0  # every indexed chunk reads back, verified

    probe = [shared[2] + tail(rng, 45, 3), shared[0] + tail(rng, 46, 3)]
    assert generate_each(llm, probe) == reference(diverse_cfg, probe)
    assert tiers.stats.hit_tokens == {GPU: 0, L1: 0, L2: 7 * CHUNK}
    settle(tiers, close=True)
