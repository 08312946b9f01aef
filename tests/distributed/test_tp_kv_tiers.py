"""KV tiers under tensor parallelism (every rank's xrt/kvstore/agent.py, rank 0's plans riding in the steps,
xrt/kvcache/plan.py): tp=2 over gloo on CPU
with cache=l1_l2, greedy tokens equal to tp=1 with the GPU cache only, while prefixes come from every rank's
own L1, then (a new run on the same directory) from every rank's own L2 namespace directory; when one rank
lost its L2 files the ranks agree on the shorter hit (none), recompute, and that rank stores them again.
`load_policy=always`: the hit counts asserted must not depend on this machine's timing."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from tp_helpers import tiny_config, tp_workers

from xrt import load_config
from xrt.config import (
    CacheArgs,
    KVTiers,
    L1Args,
    L2Args,
    L2LoadPolicy,
    ParallelArgs,
    SamplingArgs,
    SchedulerArgs,
    XrtConfig,
)
from xrt.distributed.driver import TPRunner
from xrt.distributed.wire import decode_launch, decode_step, encode_launch, encode_step
from xrt.engine.llm import LLM
from xrt.executor.runner import ModelRunner
from xrt.executor.step import DecodeBatch, SeqChunk, StepInput
from xrt.kvcache.plan import TierPlan
from xrt.kvstore.build import key_namespace
from xrt.kvstore.connector import TieredConnector
from xrt.kvstore.l2_files import l2_dir
from xrt.kvstore.stats import GPU, L1, L2

CHUNK = 16
SAMPLING = SamplingArgs(max_tokens=6, ignore_eos=True)


def prompts() -> list[list[int]]:
    """Four prompts: two long shared prefixes (5 and 3 chunks), distinct tails of uneven length."""
    rng = random.Random(0)
    shared = [[rng.randrange(3, 2000) for _ in range(n)] for n in (5 * CHUNK + 3, 3 * CHUNK)]
    return [shared[i % 2] + [rng.randrange(3, 2000) for _ in range(5 + 7 * i)] for i in range(4)]


def config(checkpoint: str, tp: int, tiers: KVTiers, path: Path, **kw: object) -> XrtConfig:
    return tiny_config(checkpoint, parallel=ParallelArgs(tp=tp, timeout_s=60),
                       cache=CacheArgs(page_size=4, num_pages=256, chunk_tokens=CHUNK, tiers=tiers,
                                       l1=L1Args(size_gb=0.002),
                                       l2=L2Args(path=str(path), load_policy=L2LoadPolicy.ALWAYS)), **kw)


def one_by_one(llm: LLM, evict: bool = False) -> list[list[int]]:
    out = []
    for p in prompts():
        if evict:
            llm.engine.scheduler.kv.evict()  # forget the GPU prefix cache: shared prefixes must come from a tier
        out.append(llm.generate([p], SAMPLING, use_tqdm=False)[0].token_ids)
    return out


def tiers_of(llm: LLM) -> TieredConnector:
    tiers = llm.engine.runner.connector
    assert isinstance(tiers, TieredConnector)
    return tiers


class Run:
    """A tp=2 run on the L2 directory, closed on leaving (one tensor-parallel run per process at a time)."""

    def __init__(self, checkpoint: str, path: Path, **kw: object) -> None:
        self.cfg = config(checkpoint, 2, KVTiers.L1_L2, path, **kw)
        self.runner = TPRunner(self.cfg)
        self.llm = LLM(self.cfg, runner=self.runner)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.close()
        assert not tp_workers()


@pytest.fixture(scope="module")
def want(tiny_checkpoint_diverse: str, tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    llm = LLM(config(tiny_checkpoint_diverse, 1, KVTiers.GPU, tmp_path_factory.mktemp("unused")))
    return one_by_one(llm)


def rank_dirs(run: Run, path: Path) -> list[Path]:
    """Each rank's L2 namespace directory (rank 1's derived as its worker does, from its own KV shard)."""
    local = run.runner.local
    return [l2_dir(path, key_namespace(run.cfg, local.kv_layout, local.checkpoint_dir, r, 2).hex()) for r in (0, 1)]


def test_prefixes_from_every_ranks_l1_then_l2(tiny_checkpoint_diverse: str, tmp_path: Path,
                                             want: list[list[int]]) -> None:
    with Run(tiny_checkpoint_diverse, tmp_path) as run:
        assert one_by_one(run.llm, evict=True) == want
        stats = tiers_of(run.llm).stats
        # prompts 2 and 3 find their shared prefix's whole chunks (5 and 3) in both ranks' L1
        assert stats.hit_tokens == {GPU: 0, L1: 8 * CHUNK, L2: 0} and stats.failed_loads == 0
        assert stats.other_ranks is None  # nothing flushed yet
        tiers_of(run.llm).flush()  # every rank's L2 writer; rank 1's counters come back with it
        dirs = rank_dirs(run, tmp_path)
        summary = stats.summary()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(d.name for d in dirs)  # one directory per rank
    counts = [len(list(d.glob("*.kv"))) for d in dirs]
    assert counts[0] == counts[1] == stats.stored_l1 > 0
    other = stats.other_ranks
    assert other is not None and other["stored_l1"] == stats.stored_l1 and other["stored_l2"] == counts[1]
    assert other["store_errors"] == other["checksum_failures"] == other["failed_loads"] == 0
    assert f"kv tiers, other ranks: chunks stored l1 {stats.stored_l1}, l2 {counts[1]}" in summary
    assert stats.as_dict()["other_ranks_stored_l2"] == counts[1]
    names = [{f.name.split("-")[0] for f in d.glob("*.kv")} for d in dirs]
    assert not names[0] & names[1]  # the ranks' keys differ

    # a new run on the same directory: empty GPU caches and L1s, the prefixes come from both ranks' L2; the
    # prompts queued together, one sequence at a time, so those behind the first wait and are read ahead of
    # admission by each rank's own prefetch thread (cache.l2.prefetch: a waiting request's prefix)
    with Run(tiny_checkpoint_diverse, tmp_path, scheduler=SchedulerArgs(max_num_seqs=1)) as run:
        assert [o.token_ids for o in run.llm.generate(prompts(), SAMPLING, use_tqdm=False)] == want
        stats = tiers_of(run.llm).stats
        assert stats.hit_tokens[L2] >= 8 * CHUNK and stats.failed_loads == 0
        tiers_of(run.llm).flush()
        assert stats.prefetched_chunks > 0 and stats.other_ranks is not None
        assert stats.other_ranks["prefetched_chunks"] == stats.prefetched_chunks
        assert stats.other_ranks["failed_loads"] == 0


@pytest.mark.parametrize("lost", ["files", "directory"])
def test_a_rank_without_its_l2_files_shortens_the_agreed_hit(tiny_checkpoint_diverse: str, tmp_path: Path,
                                                             want: list[list[int]], lost: str) -> None:
    """files: rank 1's chunk files corrupted (same size, so its start-up reconcile keeps them listed): its loads
    fail their checksums; directory: gone, index and all: it holds none. Either way rank 0 matches its own chunks
    and the loads agree on none."""
    with Run(tiny_checkpoint_diverse, tmp_path) as run:
        assert one_by_one(run.llm) == want
        dirs = rank_dirs(run, tmp_path)
    if lost == "files":
        for f in dirs[1].glob("*.kv"):
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 1
            f.write_bytes(bytes(data))
    else:
        shutil.rmtree(dirs[1])
    assert list(dirs[0].glob("*.kv"))

    with Run(tiny_checkpoint_diverse, tmp_path) as run:
        assert one_by_one(run.llm) == want
        stats = tiers_of(run.llm).stats
        # rank 0 holds its chunks, rank 1 none: the agreed prefix is empty, rank 0's chunks are no hits
        assert stats.hit_tokens[L1] == stats.hit_tokens[L2] == 0
        assert stats.computed_tokens == sum(len(p) for p in prompts()) - stats.hit_tokens[GPU]
        assert stats.failed_loads > 0  # rank 1 could not load what rank 0 matched
        tiers_of(run.llm).flush()
        # only rank 1 saw its bad chunks: its counters, summed into rank 0's stats at the flush, say so
        other = stats.other_ranks
        assert other is not None
        assert (other["checksum_failures"] > 0) == (lost == "files") and other["failed_loads"] > 0
        assert stats.checksum_failures == 0
    # rank 1 stored its chunks again (a corrupt chunk is dropped when a load finds it bad, then stored anew; the
    # one the second prompt's decode filled is never looked up: its corrupt file stays, a miss whenever read)
    assert len(list(dirs[1].glob("*.kv"))) == len(list(dirs[0].glob("*.kv")))

    with Run(tiny_checkpoint_diverse, tmp_path) as run:
        assert one_by_one(run.llm) == want
        assert tiers_of(run.llm).stats.hit_tokens[L2] >= 8 * CHUNK


def test_a_request_aborted_while_reading_frees_every_rank(tiny_checkpoint_diverse: str, tmp_path: Path,
                                                          want: list[list[int]]) -> None:
    """With tensor parallelism every tier hit reads first (every rank must hold the chunks): a request aborted in
    the reading state releases rank 0's slots at once and the other rank's through the next plan (its drops); the
    same prompt afterwards reads again on both ranks and comes out right."""
    with Run(tiny_checkpoint_diverse, tmp_path) as run:
        assert one_by_one(run.llm)[:1] == want[:1]
        engine, tiers = run.llm.engine, tiers_of(run.llm)
        sched = engine.scheduler
        sched.kv.evict()
        engine.add_request(prompts()[0], SAMPLING)
        engine.step()
        assert len(sched.reading) == 1 and tiers.stats.reads == 1  # the first run hit the GPU prefix cache only
        sched.finish(sched.reading[0], "abort")
        engine.step()  # nothing to run: the drop waits for the next plan
        tiers.flush()  # a step with the plan alone: its drops, then every rank's flush
        assert sum(tiers.l1._refs) == 0 and not len(tiers.readings)
        assert tiers.stats.other_ranks is not None and tiers.stats.other_ranks["failed_loads"] == 0
        out = run.llm.generate([prompts()[0]], SAMPLING, use_tqdm=False)[0]
        assert out.token_ids == want[0] and out.cached_tokens[L1] == 5 * CHUNK


def test_config_accepts_tiers_with_tensor_parallelism() -> None:
    cfg = load_config(["parallel.tp=2", "cache=l1_l2"])
    assert cfg.parallel.tp == 2 and cfg.cache.tiers is KVTiers.L1_L2
    assert not [p for p in cfg.check() if "tiers" in p[0] + p[1]]


def test_plans_ride_in_the_steps_round_trip() -> None:
    """Every field of a tier plan survives the wire inside a step and inside a launch, and a step without one
    carries none."""
    rng = np.random.default_rng(0)
    keys = [rng.bytes(32) for _ in range(3)]
    plan = TierPlan(stores=tuple((k, (3 * i, 3 * i + 1, 3 * i + 2)) for i, k in enumerate(keys)),
                    prefetches=(tuple(keys[:2]), ()), reads=((7, 0.25, tuple(keys)), (8, 0.0, ())),
                    loads=((7, 1, 2, 1, (4, 5, 6, 7, 8, 9)),), drops=(3, 4), polls=(8,), flush=True)
    step = StepInput(True, [SeqChunk([5, 6, 7], 4, [1, 2]), SeqChunk([9], 0, [3], False)], plan)
    assert decode_step(encode_step(step)) == step
    assert decode_step(encode_step(StepInput(False, [], TierPlan(polls=(1,))))) == StepInput(False, [],
                                                                                            TierPlan(polls=(1,)))
    assert decode_step(encode_step(StepInput(False, [SeqChunk([1], 3, [0])]))).tiers is None
    batch = DecodeBatch([1, 0], [-1, 0], [3, 4], [0, 1], [[2], [5, 6]], plan)
    got, has_after = decode_launch(encode_launch(batch, True, 4))
    assert has_after and got.tiers == plan and list(got.positions) == [3, 4] and got.page_tables.tolist() == [
        [2, 0], [5, 6]]
    with pytest.raises(ValueError, match="32 bytes"):
        TierPlan(drops=(1,), reads=((1, 0.0, (b"short",)),)).encode()


def test_one_rank_sends_no_plans(tiny_checkpoint_diverse: str, tmp_path: Path) -> None:
    cfg = config(tiny_checkpoint_diverse, 1, KVTiers.L1, tmp_path)
    with LLM(cfg, runner=ModelRunner(cfg)) as llm:
        assert tiers_of(llm).sender is None and tiers_of(llm).take_plan() is None


@pytest.fixture(autouse=True)
def no_workers_left() -> Iterator[None]:
    yield
    assert not tp_workers()
