"""The latency protocol's figures: TPOT is the mean decode step, TTFT/TPOT the median of at least 3 timed
runs by default with their spread (min–max) in the table and every run kept in the JSON line; and `xrt bench`
on a CPU warns that the protocol is sized for a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xrt.bench.engine_timing import RunTiming, split_steps, summarize
from xrt.bench.setup import cpu_warning
from xrt.bench.table import render_markdown
from xrt.cli.main import main
from xrt.config import BenchArgs, BenchScenario, Device, XrtConfig
from xrt.config.compose import load_config
from xrt.models.tiny import tiny_model_args


def test_tpot_is_the_mean_decode_step_not_the_median() -> None:
    # One prefill step, then 3 decode steps of 1, 1 and 7 ms: mean 3, median 1.
    t = split_steps([5.0, 1.0, 1.0, 7.0], [6.0, 1.5, 1.5, 12.0], output_len=4)
    assert (t.prefill_steps, t.ttft_ms, t.tpot_ms, t.tpot_wall_ms) == (1, 5.0, 3.0, 5.0)


def _run(ttft: float, tpot: float) -> RunTiming:
    return RunTiming(ttft_ms=ttft, tpot_ms=tpot, ttft_wall_ms=ttft + 0.5, tpot_wall_ms=tpot + 0.25, prefill_steps=1)


def _record(runs: list[RunTiming], **kw: object) -> dict[str, object]:
    base = {"scenario": "latency", "status": "ok", "reason": None, "executor": "cudagraph", "model": "qwen3",
            "input_len": 1024, "output_len": 256, "dtype": "bfloat16", "device_name": "H200", "torch": "2.11",
            "git_commit": "abc", "warmup": 1, "iters": len(runs), "bandwidth_gbps": 4270.0, "batch": 3,
            "bucket": 4, "floor_ms": 0.374, "floor_pct": 25.0}
    return {**base, **summarize(runs), **kw}


def _row(md: str) -> list[str]:
    (row,) = [ln for ln in md.splitlines() if ln.startswith("| cudagraph |")]
    return [c.strip() for c in row.split("|")[1:-1]]


def test_the_table_shows_the_median_and_the_spread_of_the_timed_runs() -> None:
    # bench/results/h200-4e548c7, batch 3: TPOT 1.782 and 1.231 ms in two runs; a third run of 1.507.
    runs = [_run(8.556, 1.782), _run(8.547, 1.231), _run(8.601, 1.507)]
    rec = _record(runs)
    assert (rec["ttft_ms"], rec["tpot_ms"]) == (8.556, 1.507)  # medians
    assert rec["tpot_ms_all"] == [1.782, 1.231, 1.507] and rec["ttft_ms_all"] == [8.556, 8.547, 8.601]
    assert rec["tpot_wall_ms_all"] == [2.032, 1.481, 1.757] and rec["ttft_wall_ms_all"] == [9.056, 9.047, 9.101]
    md = render_markdown([json.loads(json.dumps(rec))])  # as read back from results.jsonl
    header = [c.strip() for c in next(ln for ln in md.splitlines() if ln.startswith("| executor")).split("|")[1:-1]]
    cells = dict(zip(header, _row(md), strict=True))
    assert cells["TTFT ms (min–max)"] == "8.556 (8.547–8.601)"
    assert cells["TPOT ms (min–max)"] == "1.507 (1.231–1.782)"
    assert "median of 3" in md and "median of the timed runs, (min–max) across them" in md


def test_one_timed_run_or_an_older_line_shows_the_figure_alone() -> None:
    cells = _row(render_markdown([_record([_run(8.5, 1.5)])]))
    assert cells[3:5] == ["8.500", "1.500"]
    old = {k: v for k, v in _record([_run(8.5, 1.5), _run(9.0, 1.6)]).items() if not k.endswith("_all")}
    assert _row(render_markdown([old]))[3:5] == ["8.750", "1.550"]


def test_latency_runs_time_at_least_three_repetitions_by_default() -> None:
    assert BenchArgs().iters >= 3
    assert load_config(config_name="bench").bench.iters >= 3


def test_cpu_warning_only_for_a_model_other_than_the_tiny_one_on_a_cpu() -> None:
    qwen3 = load_config(config_name="bench")
    line = cpu_warning(qwen3, "cpu")
    assert line is not None and "sized for a GPU" in line and "model=qwen3-tiny" in line and "\n" not in line
    assert cpu_warning(qwen3, "cuda") is None
    assert cpu_warning(XrtConfig(model=tiny_model_args(), device=Device.CPU), "cpu") is None
    kernels = load_config(["bench.scenario=kernels"], config_name="bench")
    assert kernels.bench.scenario is BenchScenario.KERNELS and cpu_warning(kernels, "cpu") is None


SMALL_QWEN3 = ["model=qwen3", "model.dtype=float32", "model.vocab_size=2048", "model.hidden_size=64",
               "model.intermediate_size=128", "model.num_hidden_layers=1", "model.num_attention_heads=4",
               "model.num_key_value_heads=2", "model.head_dim=16", "bench.batch=[1]", "bench.input_len=4",
               "bench.output_len=2", "bench.warmup=0", "bench.iters=1", "bench.peer=none", "device=cpu"]


def test_xrt_bench_on_a_cpu_warns_once_through_the_logger(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", *SMALL_QWEN3, f"bench.out_dir={tmp_path}"]) == 0
    err = capsys.readouterr().err.splitlines()
    warnings = [ln for ln in err if "sized for a GPU" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("[xrt] bench on a CPU: the benchmark protocol (model qwen3)")
