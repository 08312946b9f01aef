"""The tiers never make TTFT worse than recomputing (xrt/kvstore/policy.py): loads estimated slower are not
started, a load past its deadline is abandoned (its transfer finished on another thread, its slots freed),
and the L2 writer thread is never silently dead. Also the per-request counts by tier."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.kvstore.test_tiered_engine import CHUNK, SAMPLING, cache, outputs, prompts, tiers_of
from xrt.config import KVTiers, L2LoadPolicy, XrtConfig
from xrt.engine.llm import LLM
from xrt.kvstore.connector import TieredConnector
from xrt.kvstore.keys import chunk_keys
from xrt.kvstore.l2_transfer import L2Error
from xrt.kvstore.policy import FLOOR_BYTES_PER_S, MIN_DEADLINE_S, RECENT_PREFILLS, LoadPolicy, PrefillClock
from xrt.kvstore.stats import GPU, L1, L2
from xrt.kvstore.writer import MAX_CONSECUTIVE_ERRORS


def test_policy_weighs_measured_costs() -> None:
    p = LoadPolicy()
    assert p.worth_loading(10, 10**12)  # nothing measured: the load itself measures
    assert p.deadline_s(10, 10**9) == pytest.approx(10**9 / FLOOR_BYTES_PER_S)
    p.observe_prefill(10_000, 1.0)  # 10k tokens/s
    assert p.worth_loading(10, 10**12)  # bandwidth still unmeasured
    assert p.deadline_s(1000, 10**9) == pytest.approx(max(0.1 * 1.25, MIN_DEADLINE_S))
    p.observe_l2(10**9, 1.0)  # 1 GB/s
    assert not p.worth_loading(1000, 2 * 10**9)  # 2 s to load against 0.1 s to recompute
    assert p.worth_loading(1000, 10**7)  # 10 ms to load
    p.observe_l2(10**9, 0.01)  # a fast load moves the average up, not to it
    assert 10**9 < p.l2_bandwidth < 100 * 10**9


def test_recompute_rate_is_the_fastest_recent_prefill() -> None:
    """A new engine's first prefill (one-time set-up) must not make recomputing look slow."""
    p = LoadPolicy()
    p.observe_prefill(8192, 0.3)  # the first step: ~27k tokens/s
    p.observe_prefill(8192, 0.027)  # then ~300k tokens/s
    p.observe_prefill(100, 0.01)  # a small step: 10k tokens/s
    assert p.prefill_rate == pytest.approx(8192 / 0.027)
    for _ in range(RECENT_PREFILLS):
        p.observe_prefill(1000, 0.01)  # only recent steps count
    assert p.prefill_rate == pytest.approx(100_000)


def test_prefill_clock_on_cpu() -> None:
    clock = PrefillClock(torch.device("cpu"))
    clock.start()
    clock.stop(64)
    (n, seconds), = clock.poll()
    assert n == 64 and seconds >= 0
    assert clock.poll() == []


def test_cached_tokens_per_request(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1, tmp_path)))
    first = llm.generate([prompts(0)[0]], SAMPLING, use_tqdm=False)[0]
    assert first.cached_tokens == {GPU: 0, L1: 0, L2: 0} and first.num_cached_tokens == 0
    llm.engine.scheduler.kv.evict(max_pages=6)  # the GPU keeps the prefix's first pages, L1 serves the rest
    out = llm.generate([prompts(0)[2]], SAMPLING, use_tqdm=False)[0]
    assert sum(out.cached_tokens.values()) == out.num_cached_tokens == 5 * CHUNK
    assert out.cached_tokens[GPU] > 0 and out.cached_tokens[L1] > 0 and out.cached_tokens[L2] == 0
    tiers_of(llm).flush()
    stats = tiers_of(llm).stats
    assert 0 < stats.loaded_bytes[L1] < 5 * tiers_of(llm).layout.nbytes and stats.bandwidth(L1) is not None
    plain = LLM(diverse_cfg(cache=cache(KVTiers.GPU, tmp_path)))
    plain.generate([prompts(0)[0]], SAMPLING, use_tqdm=False)
    again = plain.generate([prompts(0)[2]], SAMPLING, use_tqdm=False)[0]
    assert again.cached_tokens == {GPU: 5 * CHUNK} == {GPU: again.num_cached_tokens}


def stored_engine(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """Prompt 0's prefix (5 chunks) into L2, then a new engine: its L1 and GPU cache are empty."""
    first = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    outputs(first, prompts(0)[:2])
    tiers_of(first).flush()


def test_a_load_past_its_deadline_is_abandoned(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """A stalled read: the request is prefilled after the deadline, the transfer is left to a thread, the
    next load does not wait behind it, and once it ends its L1 slots are free again."""
    want = [outputs(LLM(diverse_cfg(cache=cache(KVTiers.GPU, tmp_path))), [p])[0] for p in prompts(0)]
    stored_engine(diverse_cfg, tmp_path)
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path, L2LoadPolicy.MEASURED)))
    tiers = tiers_of(llm)
    assert tiers.l2 is not None
    # recomputing is instant: the deadline is the minimum; the bandwidth unknown (not the start-up probe's),
    # so the load is tried
    tiers.policy.prefill_rate, tiers.policy.l2_bandwidth = 1e9, None
    agent = tiers.l2._agents["READ"]
    real_state = agent.agent.check_xfer_state
    stalled = True
    agent.agent.check_xfer_state = lambda h: "PROC" if stalled else real_state(h)
    assert outputs(llm, [prompts(0)[2]]) == [want[2]]
    s = tiers.stats
    assert s.abandoned_loads == 1 and s.hit_tokens[L2] == 0 and s.failed_loads == 0 and agent.lock.locked()
    assert outputs(llm, [prompts(0)[3]]) == [want[3]]  # the agent is still busy: abandoned at once
    assert s.abandoned_loads == 2 and s.hit_tokens[L2] == 0
    stalled = False
    assert agent.lock.acquire(timeout=10)  # the late transfer finished and released everything
    agent.lock.release()
    tiers.flush()
    assert not any(tiers.l1._refs) and not tiers.l1._writing
    assert tiers.l2.late_transfers == 1


def test_always_loads_what_the_policy_would_skip(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    stored_engine(diverse_cfg, tmp_path)
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path, L2LoadPolicy.ALWAYS)))
    tiers = tiers_of(llm)
    tiers.policy.l2_bandwidth, tiers.policy.prefill_rate = 1.0, 1e12
    outputs(llm, [prompts(0)[2]])
    assert tiers.stats.hit_tokens[L2] == 5 * CHUNK and tiers.stats.skipped_slow == 0
    assert tiers.stats.loaded_bytes[L2] == 5 * tiers.layout.nbytes and tiers.stats.bandwidth(L2) is not None


class Boom(BaseException):
    """Not an Exception: it gets past the writer's per-batch handling and ends its thread."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_writer_is_restarted(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    tiers = tiers_of(llm)
    assert tiers.l2 is not None and tiers.agent.writer is not None
    real_store = tiers.l2.store
    calls = {"n": 0}

    def store_once_fatal(items: Any) -> list[bytes]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Boom("the writer's first batch")
        return real_store(items)

    monkeypatch.setattr(tiers.l2, "store", store_once_fatal)
    dead = tiers.agent.writer._thread
    outputs(llm, [prompts(0)[0]])
    assert dead is not None
    dead.join(timeout=10)  # it died of Boom; a later commit (or flush) noticed and started another
    tiers.flush()
    assert not dead.is_alive() and tiers.agent.writer._thread is not dead and tiers.agent.writer._thread.is_alive()
    outputs(llm, [prompts(0)[1]])
    tiers.flush()
    s = tiers.stats
    # the batch the first thread died with is lost (how many of prompt 0's 5 chunks it held depends on the
    # writer's timing); everything after it is stored, prompt 1's 3 chunks included
    assert s.writer_restarts == 1 and 3 <= s.stored_l2 < 5 + 3
    assert len(list(tmp_path.glob("xrt-kv-*/*.kv"))) == s.stored_l2
    keys = chunk_keys(prompts(0)[1][: 3 * CHUNK], tiers.namespace)
    assert all(tiers.l2.contains(k) for k in keys)
    assert not any(tiers.l1._refs)  # the dead batch's slots were released


def test_failing_stores_turn_the_l2_store_off(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    tiers = tiers_of(llm)
    assert tiers.l2 is not None and tiers.agent.writer is not None

    def broken(*args: Any, **kwargs: Any) -> None:
        raise L2Error("injected: the disk is gone")

    monkeypatch.setattr(tiers.l2, "_transfer", broken)
    rng = random.Random(5)
    for _ in range(MAX_CONSECUTIVE_ERRORS + 2):
        outputs(llm, [[rng.randrange(3, 2000) for _ in range(CHUNK + 1)]])
        tiers.flush()  # one batch per prompt
    s = tiers.stats
    assert s.store_errors == MAX_CONSECUTIVE_ERRORS and tiers.agent.writer.off is not None
    assert s.dropped_l2 == 2 and s.stored_l2 == 0  # refused once off
    assert not list(tmp_path.glob("xrt-kv-*/*.kv")) and not list(tmp_path.glob("xrt-kv-*/.*.tmp"))
    assert not any(tiers.l1._refs)
    assert isinstance(tiers, TieredConnector)


def test_a_restarted_engine_starts_from_measurements(diverse_cfg: Callable[..., XrtConfig], tmp_path: Path) -> None:
    """The prefill rate is saved in the L2 directory at close and restored by the next engine, and a probe
    read of stored chunks gives the L2 bandwidth before the first load."""
    first = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    outputs(first, prompts(0)[:2])
    tiers_of(first).flush()  # folds in the last prefill's time
    rate = tiers_of(first).policy.prefill_rate
    assert rate is not None and tiers_of(first).policy.l2_bandwidth is None  # an empty directory: no probe
    tiers_of(first).close()
    (saved,) = tmp_path.glob("xrt-kv-*/measurements.json")
    assert json.loads(saved.read_text())["prefill_rate"] == {"cpu": rate}
    again = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    policy = tiers_of(again).policy
    assert policy.prefill_rate == rate and policy.l2_bandwidth is not None and policy.l2_bandwidth > 0
    tiers = tiers_of(again)
    assert not tiers.l1._writing and not any(tiers.l1._refs) and len(tiers.l1) == 0  # the probe's slots freed
    saved.write_text("{not json")  # unreadable: a first measurement again, no error
    third = LLM(diverse_cfg(cache=cache(KVTiers.L1_L2, tmp_path)))
    assert tiers_of(third).policy.prefill_rate is None
