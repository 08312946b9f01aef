"""The arithmetic of the KV-tier scenarios' figures (issue 23 item 8), on inputs whose right answer the test works
out itself: the multiturn scenario's TPOT is over a request's n - 1 decode steps (its first token, which carries
the TTFT, excluded), and the prefix scenario's L2 load bandwidth is the bytes the restarted engine read from L2
over the seconds those reads took. Unit tests of the function that computes each, and the same figures in the
records the scenarios write (the tiny model on CPU), checked against what the record's own counts say."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from xrt.bench.latency import build_engine
from xrt.bench.multiturn import run_multiturn
from xrt.bench.prefix import l2_load_gbps, run_prefix
from xrt.bench.tiers import tpot_ms
from xrt.config import XrtConfig
from xrt.config.compose import load_config

# ---------------------------------------------------------------- TPOT: n - 1 steps


def _gaps_ms(times: Sequence[float]) -> list[float]:
    return [1e3 * (b - a) for a, b in zip(times[:-1], times[1:], strict=True)]


@pytest.mark.parametrize(
    "times",
    [
        [2.0, 2.001, 2.003, 2.006],  # TTFT of 2 s, then steps of 1, 2 and 3 ms
        [0.5, 0.5, 0.75],  # a step of 0 ms (two tokens read back at once), then 250 ms
        [10.0, 10.004],  # two tokens: one step
        [0.001 * i * i for i in range(1, 40)],  # steps growing as the context does
    ],
)
def test_tpot_is_the_mean_step_after_the_first_token(times: list[float]) -> None:
    out = SimpleNamespace(request_id=0, token_ids=list(range(len(times))), token_times_s=times, ttft_s=times[0])
    want = statistics.fmean(_gaps_ms(times))  # one gap per decode step: n - 1 of them
    assert tpot_ms(out) == pytest.approx(want, rel=1e-12)
    # not the time per token of the whole request, nor the gaps averaged over n
    assert tpot_ms(out) != pytest.approx(1e3 * times[-1] / len(times))
    if times[-1] > times[0]:
        assert tpot_ms(out) != pytest.approx(1e3 * (times[-1] - times[0]) / len(times))


@pytest.mark.parametrize("times", [[], [3.0]])
def test_tpot_of_a_request_without_a_decode_step_is_none(times: list[float]) -> None:
    assert tpot_ms(SimpleNamespace(request_id=0, token_ids=times, token_times_s=times)) is None


class _Retimed:
    """A real engine whose outputs carry token times the test chose: request k (in completion order) gets its first
    token at 1 + k seconds and then steps of (k + 1) ms, 2 (k + 1) ms, 3 (k + 1) ms, ... Everything else is the
    engine's (attributes the scenario reads pass through)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.retimed: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def step(self) -> list[Any]:
        outs = []
        for o in self._engine.step():
            k = len(self.retimed)
            first = 1.0 + k
            times = [first]
            for j in range(1, len(o.token_ids)):
                times.append(times[-1] + 1e-3 * (k + 1) * j)
            o = dataclasses.replace(o, ttft_s=first, token_times_s=times)
            self.retimed.append(o)
            outs.append(o)
        return outs


MULTITURN = [
    "model=qwen3-tiny",
    "model.dtype=float32",
    "model.load_format=auto",
    "bench.scenario=multiturn",
    "bench.compare_tiers=[gpu]",
    "bench.clients=3",
    "bench.rounds=2",
    "bench.turn_len=8",
    "bench.output_len=5",
    "bench.warmup=0",
    "cache.page_size=4",
    "cache.num_pages=64",
]


def test_multiturn_tpot_and_ttft_are_over_the_requests_token_times(tiny_checkpoint: str, tmp_path: Any) -> None:
    cfg = load_config([*MULTITURN, f"bench.out_dir={tmp_path}"], config_name="bench")
    engines: list[_Retimed] = []

    def factory(c: XrtConfig) -> Any:
        engines.append(_Retimed(build_engine(c)))
        return engines[-1]

    (rec,) = run_multiturn(cfg, lambda line: None, engine_factory=factory)
    (engine,) = engines
    outs = engine.retimed
    assert len(outs) == rec["requests"] == 3 * 2 and all(len(o.token_ids) == 5 for o in outs)
    # request k: steps of (k + 1) x 1, 2, 3, 4 ms, so its TPOT is (k + 1) x 10 / 4 ms; the first token (1 + k s)
    # does not count
    want_tpot = statistics.fmean((k + 1) * 10 / 4 for k in range(len(outs)))
    assert rec["tpot_ms"] == pytest.approx(want_tpot, rel=1e-9)
    assert rec["tpot_ms"] == pytest.approx(statistics.fmean(statistics.fmean(_gaps_ms(o.token_times_s)) for o in outs))
    assert rec["ttft_ms"] == pytest.approx(statistics.fmean(1e3 * (1.0 + k) for k in range(len(outs))))


# ---------------------------------------------------------------- the prefix scenario's L2 bandwidth

@pytest.mark.parametrize(
    ("admission", "prefetch"),
    [
        ((3 * 2**20, 0.002), (0, 0.0)),  # 3 MiB read at admission in 2 ms
        ((0, 0.0), (5 * 10**8, 0.25)),  # all of it by the prefetch thread
        ((10**9, 0.5), (10**9, 1.5)),  # both: 2 GB in 2 s, 1 GB/s (not the mean of 2 and 0.67 GB/s)
        ((12345, 1e-6), (0, 0.0)),
    ],
)
def test_l2_bandwidth_is_bytes_over_seconds_of_the_l2_reads(
    admission: tuple[int, float], prefetch: tuple[int, float]
) -> None:
    stats = {
        "loaded_bytes_l2": admission[0], "load_s_l2": admission[1],
        "prefetch_bytes": prefetch[0], "prefetch_s": prefetch[1],
        # other tiers' and other counters' figures are no part of it
        "loaded_bytes_l1": 7 * 10**9, "load_s_l1": 0.001, "stored_bytes_l2": 10**12, "store_s_l2": 3.0,
    }
    total_bytes, total_s = admission[0] + prefetch[0], admission[1] + prefetch[1]
    assert l2_load_gbps(stats) == pytest.approx(total_bytes / 1e9 / total_s, rel=1e-12)
    if admission[0] and prefetch[0]:
        each = (admission[0] / admission[1] + prefetch[0] / prefetch[1]) / 2e9
        assert l2_load_gbps(stats) != pytest.approx(each)


@pytest.mark.parametrize(
    "stats",
    [
        {},  # no tier counters (cache.tiers=gpu, a stand-in engine)
        {"loaded_bytes_l2": 0, "load_s_l2": 0.0, "prefetch_bytes": 0, "prefetch_s": 0.0},  # nothing read: recomputed
        {"loaded_bytes_l2": 0, "load_s_l2": 0.004},  # a load that failed or was abandoned before any byte
        {"loaded_bytes_l2": None, "load_s_l2": None},
    ],
)
def test_l2_bandwidth_without_an_l2_read_is_none(stats: dict[str, Any]) -> None:
    assert l2_load_gbps(stats) is None


PREFIX = [
    "model=qwen3-tiny",
    "model.dtype=float32",
    "model.load_format=auto",
    "bench.scenario=prefix",
    "cache.chunk_tokens=16",
    "cache.page_size=4",
    "cache.l2.load_policy=always",  # load whatever L2 holds: the restart then reads every whole chunk
    "bench.disk_probe_mb=0",
    "bench.warmup=0",
    "bench.iters=1",
]


@pytest.mark.parametrize("prefix_len", [48, 57])
def test_prefix_l2_bandwidth_is_the_l2_bytes_over_the_l2_seconds(
    tiny_checkpoint: str, tmp_path: Any, prefix_len: int
) -> None:
    """The restart's figures: the bytes its L2 reads moved are the whole chunks it loaded times the KV bytes of a
    token (worked out here from the record's token counts), and the bandwidth is those bytes over the seconds the
    reads took (at admission and by the prefetch thread, as the record's tier counters of that phase say)."""
    cfg = load_config([*PREFIX, f"bench.prefix_lens=[{prefix_len}]", f"bench.out_dir={tmp_path}"],
                      config_name="bench")
    (r,) = run_prefix(cfg, lambda line: None)
    (run,) = r["runs"]
    whole = prefix_len // 16 * 16
    assert run["l2_choice"] == "loaded" and run["l2_tokens"] == whole == r["chunk_prefix_tokens"]
    stats = r["tier_stats_restart"]  # one iteration: the restart phase's own counters
    moved = stats.get("loaded_bytes_l2", 0) + stats.get("prefetch_bytes", 0)
    seconds = stats.get("load_s_l2", 0) + stats.get("prefetch_s", 0)
    assert moved == whole * r["kv_bytes_per_token"]  # every loaded chunk read once, nothing else counted
    assert seconds > 0
    assert run["l2_load_gbps"] == pytest.approx(moved / seconds / 1e9, rel=1e-12)
    assert r["l2_load_gbps"] == run["l2_load_gbps"]  # the median of one
