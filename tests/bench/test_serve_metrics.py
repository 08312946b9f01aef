"""The serve scenario's arithmetic against figures worked out by hand from timings the test chooses (vLLM's
definitions: TPOT over output tokens - 1, ITL per chunk gap, goodput within every SLO, numpy's linear percentiles),
its workload (lengths within the range ratio, arrivals of the asked rate and burstiness), its output block and table,
and the key a sweep's objective reads."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from xrt.bench.serve_metrics import objective_key, peak_concurrency, percentile_key, serve_metrics, server_times
from xrt.bench.serve_table import render_serve, result_lines
from xrt.bench.sweep_results import objective_value
from xrt.bench.workload import arrival_offsets, serve_lengths
from xrt.config import BenchArgs, BenchObjective, BenchScenario, XrtConfig


def req(start: float, ttft: float, itl: list[float], latency: float, prompt: int, out: int, ok: bool = True,
        cached: int = 0) -> dict[str, Any]:
    return {"ok": ok, "error": None if ok else "HTTP 500: boom", "start": start, "ttft": ttft, "itl": itl,
            "latency": latency, "prompt_len": prompt, "output_tokens": out, "cached_tokens": cached}


# 5 tokens: TTFT 100 ms, E2EL 200 ms, so TPOT = 100 / 4 = 25 ms; 1 token: no TPOT (goodput counts it as 0); a failure.
REQUESTS = [
    req(0.0, 0.1, [0.02, 0.02, 0.03, 0.03], 0.2, prompt=10, out=5, cached=4),
    req(0.1, 0.3, [], 0.3, prompt=20, out=1),
    req(0.2, 0.05, [], 0.05, prompt=30, out=0, ok=False),
]


def test_figures_are_vllms_from_per_request_timings() -> None:
    m = serve_metrics(REQUESTS, 2.0, [50, 99], {})
    assert (m["completed"], m["failed"]) == (2, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"], m["cached_prompt_tokens"]) == (30, 6, 4)  # done only
    assert m["request_throughput"] == 1.0 and m["output_throughput"] == 3.0 and m["total_token_throughput"] == 18.0
    assert m["request_goodput"] is None  # no SLO set
    assert m["mean_ttft_ms"] == pytest.approx(200) and m["median_ttft_ms"] == pytest.approx(200)
    assert m["std_ttft_ms"] == pytest.approx(100)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 200)  # linear between the two samples
    assert m["p50_ttft_ms"] == pytest.approx(200)
    # TPOT only from the 5-token request: (200 - 100) / 4
    assert m["mean_tpot_ms"] == m["median_tpot_ms"] == m["p99_tpot_ms"] == pytest.approx(25)
    assert m["mean_itl_ms"] == pytest.approx(25) and m["median_itl_ms"] == pytest.approx(25)
    assert m["p99_itl_ms"] == pytest.approx(30)
    assert m["mean_e2el_ms"] == pytest.approx(250) and m["p99_e2el_ms"] == pytest.approx(200 + 0.99 * 100)
    # in flight: [0, 0.2], [0.1, 0.4], [0.2, 0.25]; the first ends as the third starts
    assert m["peak_concurrent_requests"] == 2


@pytest.mark.parametrize(
    "slos,good",
    [
        ({"ttft": 250}, 1),  # 100 ms in, 300 ms out
        ({"ttft": 300}, 2),  # a bound is inclusive
        ({"tpot": 20}, 1),  # 25 ms out; the one-token request's TPOT counts as 0
        ({"ttft": 250, "tpot": 20}, 0),  # every bound must hold
        ({"e2el": 250}, 1),
    ],
)
def test_goodput_counts_requests_within_every_slo(slos: dict[str, float], good: int) -> None:
    assert serve_metrics(REQUESTS, 2.0, [99], slos)["request_goodput"] == good / 2.0


def test_no_sample_is_none_not_zero() -> None:
    m = serve_metrics([req(0.0, 0.1, [], 0.1, prompt=3, out=1)], 1.0, [99], {})
    assert m["mean_tpot_ms"] is None and m["p99_tpot_ms"] is None and m["mean_itl_ms"] is None
    assert m["mean_ttft_ms"] == pytest.approx(100)


def test_peak_concurrency_and_percentile_names() -> None:
    assert peak_concurrency([req(s, 0.1, [], 1.0, 1, 1) for s in (0.0, 0.5, 0.9, 1.5)]) == 3
    assert peak_concurrency([]) == 0
    assert [percentile_key(p) for p in (99, 99.0, 99.9, 50)] == ["p99", "p99", "p99.9", "p50"]


def _cfg(**bench: Any) -> XrtConfig:
    return XrtConfig(bench=BenchArgs(scenario=BenchScenario.SERVE, **bench))


def test_lengths_stay_within_the_range_ratio_and_repeat_by_seed() -> None:
    ins, outs = serve_lengths(_cfg(num_requests=2000, input_len=100, output_len=40, range_ratio=0.5))
    assert len(ins) == len(outs) == 2000
    assert min(ins) == 50 and max(ins) == 150 and min(outs) == 20 and max(outs) == 60  # 2000 draws reach the ends
    assert statistics.fmean(ins) == pytest.approx(100, rel=0.03)
    assert serve_lengths(_cfg(num_requests=2000, input_len=100, output_len=40, range_ratio=0.5)) == (ins, outs)
    fixed = serve_lengths(_cfg(num_requests=5, input_len=7, output_len=3))
    assert fixed == ([7] * 5, [3] * 5)
    assert min(serve_lengths(_cfg(num_requests=50, input_len=1, output_len=1, range_ratio=1.0))[0]) == 1


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_arrivals_have_the_rate_and_the_gamma_shape(burstiness: float) -> None:
    n, rate = 4000, 20.0
    offsets = arrival_offsets(n, rate, burstiness, seed=3)
    assert offsets[-1] == pytest.approx(n / rate)  # scaled so the last request goes at num / rate (vLLM)
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert min(gaps) >= 0
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=1e-9)
    # a gamma of shape k has a coefficient of variation of 1 / sqrt(k): 1 for Poisson arrivals
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)
    assert arrival_offsets(n, rate, burstiness, seed=3) == offsets
    assert arrival_offsets(3, 0.0, burstiness, seed=3) == [0.0, 0.0, 0.0]  # rate 0: all at once


def _record(**extra: Any) -> dict[str, Any]:
    m = serve_metrics(REQUESTS, 2.0, [99], {"ttft": 250})
    return {"scenario": "serve", "status": "ok", "executor": "eager", "model": "m", "device_name": "cpu",
            "num_requests": 3, "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": 2, "input_len": 20,
            "output_len": 3, "range_ratio": 0.5, "percentiles": [99], "slo_ms": {"ttft": 250},
            "errors": ["HTTP 500: boom"], "config": {}, **m,
            **server_times({"ttft": {"sum": 0.3, "count": 2}, "queue": {"sum": 0.02, "count": 2},
                            "prefill": {"sum": 0.1, "count": 2}}), **extra}


def test_the_block_and_the_table_show_the_record() -> None:
    r = _record()
    block = "\n".join(result_lines(r))
    for line in ("Successful requests:                     2", "Failed requests:                         1",
                 "Maximum request concurrency:             2", "Request goodput (req/s):                 0.50",
                 "Mean TPOT (ms):                          25.00", "P99 ITL (ms):                            30.00",
                 "Median E2EL (ms):                        250.00", "first errors: HTTP 500: boom"):
        assert line in block
    assert "Server's mean TTFT (ms):                 150.00" in block
    assert "  of which queue (ms):                   10.00" in block
    assert "  of which prefill (ms):                 50.00" in block
    assert "HTTP round trip" not in block  # none measured
    r = {**r, "http_rtt_ms": 0.8}
    assert "HTTP round trip, GET /v1/models (ms):".ljust(40) + " 0.80" in "\n".join(result_lines(r))
    table = render_serve([r, {**r, "request_rate": 0.0, "max_concurrency": 0, "server_mean_ttft_ms": None,
                              "server_mean_prefill_ms": None, "http_rtt_ms": None}])
    assert "## Serve: m, input 20 / output 3 ±50%, cpu" in table
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in table if ln.startswith("| eager")]
    assert [row[:4] for row in rows] == [["eager", "4/s", "2 (peak 2)", "2 (1)"],
                                         ["eager", "all at once", "– (peak 2)", "2 (1)"]]
    assert rows[0][6] == "0.50 (ttft ≤ 250)"
    assert (rows[0][10], rows[1][10]) == ("150.0", "–")  # the server's TTFT
    assert (rows[0][11], rows[1][11]) == ("10.00 + 50.00", "–")  # the engine's part: queue + prefill
    assert (rows[0][12], rows[1][12]) == ("0.800", "–")  # the HTTP round trip
    assert rows[0][13] == "25.00 / 25.00 / 25.00"  # TPOT mean / median / p99
    assert render_serve([{**r, "scenario": "latency"}]) == []


def test_the_servers_times_are_its_histograms_gains_over_the_run() -> None:
    got = server_times({"ttft": {"sum": 0.3, "count": 2.0}, "queue": {"sum": 0.01, "count": 2.0}})
    assert got == {"server_mean_ttft_ms": pytest.approx(150), "server_ttft_count": 2,
                   "server_mean_queue_ms": pytest.approx(5), "server_mean_prefill_ms": None}
    assert server_times({"ttft": {"sum": 0.0, "count": 0.0}})["server_mean_ttft_ms"] is None
    assert server_times(None) == {"server_mean_ttft_ms": None, "server_ttft_count": None,
                                  "server_mean_queue_ms": None, "server_mean_prefill_ms": None}


def test_a_sweep_reads_the_vllm_keys_of_a_serve_line() -> None:
    r = _record()
    assert objective_key(r, BenchObjective.OUTPUT_TOKENS_PER_S) == "output_throughput"
    assert objective_key({"scenario": "throughput"}, BenchObjective.OUTPUT_TOKENS_PER_S) == "output_tokens_per_s"
    assert objective_value([r], BenchObjective.GOODPUT) == 0.5
    assert objective_value([r], BenchObjective.TTFT_MS) == pytest.approx(200)
    assert BenchArgs(scenario=BenchScenario.SERVE).objective_metric() is BenchObjective.OUTPUT_TOKENS_PER_S
    assert BenchArgs(scenario=BenchScenario.SERVE, slo_tpot_ms=50).objective_metric() is BenchObjective.GOODPUT
