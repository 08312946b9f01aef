"""The reading state (xrt/kvstore/reads.py, the scheduler's `reading`): a request whose prefix must be read from L2
waits out of the queue while the reader thread holds its chunks in L1, the scheduler never waits on the disk (the
requests behind it run meanwhile), it is admitted with what was read once the read is over, and one that leaves
while reading (aborted) releases every L1 slot and page. The L2 read is held back by a gate on the store's load."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from test_tiered_engine import CHUNK, SAMPLING, cache, tiers_of

from xrt.config import KVTiers, XrtConfig
from xrt.engine.llm import LLM
from xrt.engine.sequence import SeqStatus
from xrt.kvstore.connector import TieredConnector
from xrt.kvstore.stats import GPU, L2


def prompt(seed: int, chunks: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2000) for _ in range(chunks * CHUNK + 5)]


@contextmanager
def gated_l2(tiers: TieredConnector) -> Iterator[threading.Event]:
    """Every L2 load blocks until the event is set (the reader thread waits, never the scheduler)."""
    assert tiers.l2 is not None
    gate, load = threading.Event(), tiers.l2.load

    def slow_load(*args: object, **kw: object):  # noqa: ANN202
        assert threading.current_thread() is not threading.main_thread(), "an L2 read on the scheduler's thread"
        gate.wait(30)
        return load(*args, **kw)

    tiers.l2.load = slow_load  # type: ignore[method-assign]
    try:
        yield gate
    finally:
        gate.set()
        tiers.l2.load = load  # type: ignore[method-assign]


def stored_run(cfg: XrtConfig, prompts: list[list[int]]) -> list[list[int]]:
    """Run the prompts once (their chunks go to L2) and close: the next engine's L1 and GPU cache are empty."""
    with LLM(cfg) as llm:
        return [o.token_ids for o in llm.generate(prompts, SAMPLING, use_tqdm=False)]


def test_a_request_reading_from_l2_lets_the_others_run(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    cfg = diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path))
    stored, fresh = prompt(0, 5), prompt(1, 2)
    want = stored_run(cfg, [stored]) + stored_run(diverse_cfg(cache=cache(KVTiers.GPU, tmp_path)), [fresh])
    with LLM(cfg) as llm:
        tiers, engine = tiers_of(llm), llm.engine
        with gated_l2(tiers) as gate:
            a = engine.add_request(stored, SAMPLING)
            b = engine.add_request(fresh, SAMPLING)
            start = time.perf_counter()
            finished = {}
            while len(finished) < 1:  # b runs to the end while a's read is held back
                for out in engine.step():
                    finished[out.request_id] = out
                assert time.perf_counter() - start < 20
            sched = engine.scheduler
            assert list(finished) == [b] and [s.request_id for s in sched.reading] == [a]
            assert sched.reading[0].status is SeqStatus.READING and not sched.reading[0].page_table
            gate.set()
            while engine.has_unfinished():
                for out in engine.step():
                    finished[out.request_id] = out
        assert [finished[a].token_ids, finished[b].token_ids] == want
        # a's whole prefix came from L2 (5 chunks, its last token computed), none of it recomputed
        assert finished[a].cached_tokens[L2] == 5 * CHUNK and finished[a].cached_tokens[GPU] == 0
        assert tiers.stats.reads == 1 and tiers.stats.read_wait_s > 0


def test_a_request_aborted_while_reading_releases_everything(diverse_cfg: Callable[..., XrtConfig],
                                                             tmp_path: Path) -> None:
    cfg = diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path))
    stored = prompt(2, 6)
    want = stored_run(cfg, [stored])
    with LLM(cfg) as llm:
        tiers, engine = tiers_of(llm), llm.engine
        sched = engine.scheduler
        with gated_l2(tiers) as gate:
            engine.add_request(stored, SAMPLING)
            engine.step()
            assert len(sched.reading) == 1
            seq = sched.reading[0]
            sched.finish(seq, "abort")
            assert not sched.has_unfinished() and not len(tiers.readings) and not tiers.agent._reads
            gate.set()
        tiers.flush()  # the read thread's batch in flight lands, and is released (nothing references it)
        l1 = tiers.l1
        assert sum(l1._refs) == 0 and not l1._writing
        assert sched.kv.num_free_pages == sched.kv.num_pages
        # the same prompt again: its chunks are in L1 now (the aborted read published them), the outputs right
        out = llm.generate([stored], SAMPLING, use_tqdm=False)[0]
        assert out.token_ids == want[0] and out.cached_tokens[GPU] + sum(
            n for t, n in out.cached_tokens.items() if t != GPU) == 6 * CHUNK


def test_a_read_past_its_deadline_admits_what_it_holds(diverse_cfg: Callable[..., XrtConfig],
                                                       tmp_path: Path) -> None:
    """load_policy=measured: a read may take what recomputing its tokens costs; held back past that, the request
    is admitted anyway and computes its prefix (the read counted abandoned), with the same tokens."""
    from xrt.config import L2LoadPolicy

    cfg = diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path, policy=L2LoadPolicy.MEASURED))
    stored = prompt(3, 4)
    want = stored_run(cfg, [stored])
    with LLM(cfg) as llm:
        tiers = tiers_of(llm)
        # recomputing is about free, the L2 bandwidth unknown: the read is started, with the floor as deadline
        tiers.policy.prefill_rate, tiers.policy.l2_bandwidth = 1e9, None
        with gated_l2(tiers) as gate:
            start = time.perf_counter()
            out = llm.generate([stored], SAMPLING, use_tqdm=False)[0]
            waited = time.perf_counter() - start
            gate.set()
        assert out.token_ids == want[0] and out.cached_tokens[L2] == 0
        assert tiers.stats.abandoned_loads >= 1 and waited < 25
