"""`xrt bench bench.scenario=serve` end to end on the tiny model: its own in-process server (dummy weights: no
tokenizer, so every chunk's text is empty), and a server the test starts, named by bench.url, whose own
Prometheus counters are the reference for what the benchmark counted; a server it cannot reach, a workload past the
model and bad fields each stop with one line; a sweep job returns the objective from the serve line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from conftest import tiny_config  # noqa: E402

from xrt.cli.main import main  # noqa: E402
from xrt.config import SchedulerArgs  # noqa: E402
from xrt.config.compose import load_config  # noqa: E402
from xrt.reflect import ConfigError  # noqa: E402
from xrt.serve.app import build_state  # noqa: E402
from xrt.serve.server import BackgroundServer  # noqa: E402

TINY = ["model=qwen3-tiny", "model.dtype=float32", "bench.scenario=serve"]


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]


def _line(out: Path) -> dict[str, Any]:
    (line,) = _lines(out)
    return line


def test_cli_serves_the_config_and_reports_vllms_figures(
    tiny_checkpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    n, inp, outp = 6, 8, 5
    rc = main(["bench", *TINY, "model.load_format=dummy", f"bench.num_requests={n}", f"bench.input_len={inp}",
               f"bench.output_len={outp}", "bench.request_rate=[0,40]", "bench.max_concurrency=4",
               "bench.slo_e2e_ms=100000", "serve.api_key=secret", f"bench.out_dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rows = _lines(tmp_path)
    assert [r["request_rate"] for r in rows] == [0.0, 40.0]  # a line per rate, in order
    for r in rows:
        assert (r["scenario"], r["status"], r["executor"], r["model"], r["served_model"]) == (
            "serve", "ok", "eager", "qwen3-tiny", "qwen3-tiny")
        assert (r["completed"], r["failed"], r["errors"]) == (n, 0, [])
        assert (r["total_input_tokens"], r["total_output_tokens"]) == (n * inp, n * outp)  # ignore_eos: every token
        assert r["cached_prompt_tokens"] == 0  # the second rate's prompts are new ones
        assert r["request_throughput"] == pytest.approx(n / r["duration"])
        assert r["total_token_throughput"] == pytest.approx(n * (inp + outp) / r["duration"])
        assert r["request_goodput"] == r["request_throughput"]  # every request within 100 s
        assert 1 <= r["peak_concurrent_requests"] <= 4
        # A chunk per token although no text comes (no tokenizer): ITL samples, TTFT before the stream's end.
        assert r["mean_itl_ms"] is not None and r["mean_ttft_ms"] < r["mean_e2el_ms"]
        for m in ("ttft", "tpot", "itl", "e2el"):
            assert r[f"mean_{m}_ms"] > 0 and r[f"median_{m}_ms"] <= r[f"p99_{m}_ms"]
        # the server saw the timed requests only (the warm-up came before the first rate's reading)
        assert r["server_ttft_count"] == n and 0 < r["server_mean_ttft_ms"] <= r["mean_ttft_ms"]
        # a GET the engine never sees returns sooner than a first token
        assert 0 < r["http_rtt_ms"] < r["mean_ttft_ms"]
    assert out.count("Successful requests:                     6") == 2 and "Mean TPOT (ms):" in out
    md = (tmp_path / "results.md").read_text()
    assert "## Serve: qwen3-tiny, input 8 / output 5" in md
    assert "| eager | 40/s |" in md and "| eager | all at once |" in md
    assert (tmp_path / "plot.png").stat().st_size > 0


@pytest.fixture
def tiny_server(tiny_checkpoint: str) -> Iterator[tuple[BackgroundServer, Any]]:
    state = build_state(attrs.evolve(tiny_config(tiny_checkpoint), scheduler=SchedulerArgs(max_num_seqs=8)))
    server = BackgroundServer(state).start()
    try:
        yield server, state.metrics
    finally:
        server.stop()


def _value(metrics: Any, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, {"model_name": "qwen3-tiny", **labels})
    return 0.0 if value is None else value


def test_bench_url_is_measured_and_agrees_with_the_servers_own_counts(
    tiny_server: tuple[BackgroundServer, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server, metrics = tiny_server
    n = 10
    rc = main(["bench", *TINY, f"bench.url={server.url}/", f"bench.num_requests={n}", "bench.input_len=12",
               "bench.output_len=6", "bench.range_ratio=0.5", "bench.request_rate=200", "bench.warmup=0",
               "bench.percentiles=[50,90,99.9]", f"bench.out_dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = _line(tmp_path)
    assert (r["executor"], r["model"], r["device_name"], r["dtype"]) == ("external", "qwen3-tiny", f"{server.url}/",
                                                                         None)
    assert r["completed"] == n and r["request_goodput"] is None
    # what the server counted (bench.warmup=0: only the timed requests reached it)
    assert _value(metrics, "xrt:request_success_total", finished_reason="length") == n
    assert _value(metrics, "xrt:prompt_tokens_total") == r["total_input_tokens"]
    assert _value(metrics, "xrt:generation_tokens_total") == r["total_output_tokens"]
    assert r["server_ttft_count"] == n
    assert r["server_mean_ttft_ms"] == pytest.approx(1000 * _value(metrics, "xrt:time_to_first_token_seconds_sum") / n)
    assert n * 6 * 0.5 <= r["total_output_tokens"] <= n * 6 * 1.5 and r["total_output_tokens"] != n * 6
    # the client's clock starts before the server's and stops after it, request by request
    assert n * r["mean_ttft_ms"] / 1000 >= _value(metrics, "xrt:time_to_first_token_seconds_sum")
    assert n * r["mean_e2el_ms"] / 1000 >= _value(metrics, "xrt:e2e_request_latency_seconds_sum")
    assert {"p50_ttft_ms", "p90_itl_ms", "p99.9_e2el_ms"} <= set(r)
    assert "P99.9 E2EL (ms):" in out


def test_a_server_it_cannot_reach_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["bench", *TINY, f"bench.url=http://127.0.0.1:{port}", "bench.num_requests=2",
               f"bench.out_dir={tmp_path}"])
    _, err = capsys.readouterr()
    assert rc == 2
    assert err.startswith(f"error: bench.url: GET http://127.0.0.1:{port}/v1/models: ClientConnectorError: "
                          "Cannot connect")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_url_that_is_not_http_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["bench", *TINY, "bench.url=localhost:8000", f"bench.out_dir={tmp_path}"])
    _, err = capsys.readouterr()
    assert (rc, err) == (2, "error: bench.url: expected http://HOST:PORT or https://..., got 'localhost:8000'\n")


def test_a_workload_past_the_model_stops_before_serving(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["bench", *TINY, "bench.input_len=2000", "bench.output_len=100", "bench.range_ratio=0.1",
               f"bench.out_dir={tmp_path}"])
    _, err = capsys.readouterr()
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: bench.input_len + bench.output_len: the longest request (bench.range_ratio=0.1) "
                           "needs ") and line.endswith("more than model.max_position_embeddings=2048")


@pytest.mark.parametrize(
    "override,problem",
    [
        ("bench.request_rate=-1", ("bench.request_rate", "element 0 must be >= 0, got -1")),
        ("bench.request_rate=[4,inf]", ("bench.request_rate[1]", "must be a finite number, got inf")),
        ("bench.request_rate=[]", ("bench.request_rate", "must list at least one rate (0: all at once), got []")),
        ("bench.burstiness=0", ("bench.burstiness", "must be > 0, got 0")),
        ("bench.max_concurrency=-2", ("bench.max_concurrency", "must be >= 0, got -2")),
        ("bench.range_ratio=1.5", ("bench.range_ratio", "must be in [0, 1], got 1.5")),
        ("bench.percentiles=[99,0]", ("bench.percentiles", "element 1 must be in (0, 100], got 0")),
        ("bench.slo_tpot_ms=-5", ("bench.slo_tpot_ms", "must be >= 0, got -5")),
        ("bench.objective=goodput",
         ("bench.objective", "goodput needs a bound: set bench.slo_ttft_ms, slo_tpot_ms or slo_e2e_ms")),
        ("bench.objective=l2_ttft_ms",
         ("bench.objective", "the serve scenario does not measure l2_ttft_ms; expected one of goodput, "
                             "output_tokens_per_s, requests_per_s, tokens_per_s, tpot_ms, ttft_ms or auto")),
    ],
)
def test_bad_serve_fields_are_one_line_naming_the_field(override: str, problem: tuple[str, str]) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["bench.scenario=serve", override], config_name="bench")
    assert e.value.problems == [problem]


def test_a_sweep_job_returns_the_serve_lines_objective(
    tiny_checkpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    rc = main(["bench", "-m", *TINY, "model.load_format=dummy", "bench.num_requests=3", "bench.input_len=4",
               "bench.output_len=3", "bench.request_rate=0,50", "bench.slo_ttft_ms=100000",
               f"hydra.sweep.dir={sweep}"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    for job, rate in ((0, 0.0), (1, 50.0)):
        r = _line(sweep / str(job))
        assert r["request_rate"] == rate
        assert r["sweep"]["objective"] == "goodput" and r["sweep"]["value"] == r["request_goodput"] > 0
    assert "[bench] best goodput: " in out
    md = (sweep / "results.md").read_text()  # one table, a row per rate (the rate is the row's column)
    assert md.count("## Serve: ") == 1 and "| eager | all at once |" in md and "| eager | 50/s |" in md
