"""xrt bench: the timing split, the floor, the table, and the real CLI on the tiny model (CPU)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from xrt.bench.anchors import load_xllm
from xrt.bench.cells import label_order
from xrt.bench.engine_timing import Engine, split_steps
from xrt.bench.floor import decode_kv_bytes, decode_weight_bytes
from xrt.bench.latency import build_engine, run_latency
from xrt.bench.report import main as report_main
from xrt.bench.report import regenerate
from xrt.bench.results import write_records
from xrt.bench.setup import BenchError, bench_config, decode_bucket
from xrt.bench.table import _peer, render_markdown
from xrt.bench.workload import random_lengths, random_prompts
from xrt.cli.main import main
from xrt.config import (
    BenchArgs,
    BenchPeer,
    BenchScenario,
    Device,
    DType,
    ExecutorArgs,
    ExecutorKind,
    LoadFormat,
    ModelArgs,
    XrtConfig,
)

QWEN3_0_6B = ModelArgs(name="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                       max_position_embeddings=40960, max_model_len=2048)
TINY = ["model=qwen3-tiny", "model.dtype=float32", "bench.input_len=8", "bench.output_len=4",
        "bench.warmup=1", "bench.iters=2"]


def test_split_steps_separates_prefill_from_decode() -> None:
    # Two prefill steps (chunked), then output_len - 1 = 3 decode steps.
    t = split_steps([5.0, 7.0, 1.0, 2.0, 3.0], [6.0, 8.0, 1.5, 2.5, 3.5], output_len=4)
    assert (t.prefill_steps, t.ttft_ms, t.tpot_ms) == (2, 12.0, 2.0)
    assert (t.ttft_wall_ms, t.tpot_wall_ms) == (14.0, 2.5)
    assert split_steps([4.0], [4.0], output_len=1).tpot_ms is None
    with pytest.raises(RuntimeError, match="at least 4 engine steps"):
        split_steps([1.0, 1.0], [1.0, 1.0], output_len=4)


def test_floor_bytes_match_qwen3_0_6b() -> None:
    m = QWEN3_0_6B
    assert decode_weight_bytes(m, 2) == pytest.approx(1.192e9, rel=1e-3)
    # 28 layers * K and V * 8 heads * 128 dims * 2 bytes per token.
    assert decode_kv_bytes(m, 4, 1000, 2) == 4 * 1000 * 28 * 2 * 8 * 128 * 2


def test_bench_config_fits_the_largest_batch_in_one_prefill() -> None:
    cfg = XrtConfig(model=QWEN3_0_6B, bench=BenchArgs(batch=[1, 100], input_len=2000, output_len=256))
    c = bench_config(cfg)
    assert c.scheduler.max_batched_tokens == 100 * 2000
    assert c.scheduler.max_num_seqs == 256
    assert c.model.max_model_len == 2256
    assert cfg.scheduler.max_batched_tokens == 8192  # the caller's config is untouched
    long = XrtConfig(model=ModelArgs(max_position_embeddings=4096, max_model_len=1024),
                     bench=BenchArgs(input_len=4000, output_len=200))
    with pytest.raises(BenchError, match=r"bench.input_len \+ bench.output_len: must be <= .*4096, got 4200"):
        bench_config(long)
    tput = XrtConfig(model=QWEN3_0_6B, bench=BenchArgs(scenario=BenchScenario.THROUGHPUT, max_len=3000))
    assert bench_config(tput).model.max_model_len == 6000


def test_decode_bucket_follows_the_graph_buckets() -> None:
    graph = ExecutorArgs(kind=ExecutorKind.CUDAGRAPH, max_batch=128)
    assert [decode_bucket(graph, b) for b in (1, 3, 13, 47, 100, 129)] == [1, 4, 16, 48, 112, None]
    assert decode_bucket(ExecutorArgs(), 3) is None


def test_workload_is_seeded_and_varies_by_repetition() -> None:
    a = random_prompts(2048, 3, 16, seed=0, rep=0)
    assert a == random_prompts(2048, 3, 16, seed=0, rep=0)
    assert a != random_prompts(2048, 3, 16, seed=0, rep=1)
    assert len(a) == 3 and all(len(p) == 16 and all(0 <= t < 2048 for t in p) for p in a)
    lens = random_lengths(50, 100, 120, seed=1)
    assert all(100 <= i <= 120 and 100 <= o <= 120 for i, o in lens) and len(set(lens)) > 1


def _record(batch: int, **kw: object) -> dict[str, object]:
    base = {"scenario": "latency", "status": "ok", "reason": None, "executor": "cudagraph", "model": "qwen3",
            "input_len": 1024, "output_len": 256, "dtype": "bfloat16", "device_name": "H200", "torch": "2.11",
            "git_commit": "abc", "warmup": 1, "iters": 3, "bandwidth_gbps": 4270.0, "batch": batch, "bucket": batch,
            "ttft_ms": 5.0, "tpot_ms": 1.0, "peer_ttft_ms": 50.0, "peer_tpot_ms": 20.0, "peer_ttft_ratio": 10.0,
            "peer_tpot_ratio": 20.0, "floor_ms": 0.3, "floor_pct": 30.0}
    return {**base, **kw}


def test_table_has_a_row_per_batch_with_xllm_columns() -> None:
    assert load_xllm()[1]["py_graph_tpot"] == pytest.approx(2.013)
    records = [_record(1, tpot_ms=9.0), _record(8), _record(1, tpot_ms=0.8),
               _record(100, status="skipped", reason="needs 9000 KV pages, the cache has 10")]
    md = render_markdown(records)
    rows = [ln for ln in md.splitlines() if ln.startswith("| cudagraph |")]
    assert len(rows) == 3  # the later batch-1 line replaced the earlier one
    assert "| 0.800 |" in rows[0] and "8.237 / 2.013" in rows[0] and "6.241 / 1.994" in rows[0]
    assert "20.00×" in rows[0] and "30%" in rows[0]
    assert "skipped: needs 9000 KV pages" in rows[2] and rows[2].count("|") == rows[0].count("|")
    other = render_markdown([_record(1, input_len=8, output_len=4)])
    assert "2.013" not in other  # xLLM's figures only beside the same lengths


def test_table_rows_of_a_sweep_sort_numbers_as_numbers() -> None:
    def swept(seqs: object, temp: float) -> dict[str, object]:
        return _record(1, config={"scheduler": {"max_num_seqs": seqs}, "sampling": {"temperature": temp}})

    records = [swept(16, 0.5), swept(8, 0.5), swept(128, 0.25), swept(8, 0.25)]
    md = render_markdown(records)
    labels = [ln.split("|")[1].strip() for ln in md.splitlines() if ln.startswith("| cudagraph")]
    assert labels == [f"cudagraph sampling.temperature={t} scheduler.max_num_seqs={n}"
                      for t, n in ((0.25, 8), (0.25, 128), (0.5, 8), (0.5, 16))]
    assert [label_order(x) < label_order(y) for x, y in (("a x=2", "a x=10"), ("a x=10", "a x=b"))] == [True, True]


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def test_report_without_matplotlib_leaves_the_plot_for_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_records(tmp_path, [_record(1), _record(8)], fresh=True)
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "matplotlib", None)  # as on the GPU machine
        lines = regenerate(tmp_path)
    assert "plot.png left out: matplotlib is not installed" in lines[1]
    assert not (tmp_path / "plot.png").exists() and (tmp_path / "results.md").is_file()
    assert report_main([str(tmp_path)]) == 0
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    assert report_main([str(tmp_path / "missing")]) == 2
    assert "usage: python -m xrt bench report DIR" in capsys.readouterr().err


def test_run_latency_frees_its_engine_for_the_next_job() -> None:
    engines: list[weakref.ref[Engine]] = []

    def factory(cfg: XrtConfig) -> Engine:
        engine = build_engine(cfg)
        engines.append(weakref.ref(engine))
        return engine

    cfg = XrtConfig(model=ModelArgs(load_format=LoadFormat.DUMMY, dtype=DType.FLOAT32), device=Device.CPU,
                    bench=BenchArgs(batch=[2], input_len=4, output_len=3, warmup=0, iters=1))
    (rec,) = run_latency(cfg, lambda line: None, engine_factory=factory)
    assert rec["status"] == "ok" and rec["ttft_ms"] > 0 and rec["prefill_steps"] == 1
    assert engines and engines[0]() is None


def _bench(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str, peer: str = "none") -> Ran:
    """`python -m xrt bench ...` in this process (the same entry point, without re-importing torch)."""
    rc = main(["bench", *TINY, f"bench.peer={peer}", f"bench.out_dir={tmp_path}", *args])
    out, err = capsys.readouterr()
    return Ran(rc, out, err)


def _lines(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]


def test_cli_latency_with_hf_peer_writes_jsonl_table_and_plot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    r = _bench(capsys, tmp_path, "bench.batch=[1,2]", peer="hf")
    assert r.returncode == 0, r.stderr
    assert "[bench] eager batch 2: TTFT" in r.stdout
    lines = _lines(tmp_path)
    assert [x["batch"] for x in lines] == [1, 2]
    for x in lines:
        assert x["status"] == "ok" and x["executor"] == "eager" and x["prefill_steps"] == 1
        assert x["ttft_ms"] > 0 and x["tpot_ms"] > 0 and x["peer_ttft_ms"] > 0 and x["peer_tpot_ms"] > 0
        assert x["peer_tpot_ratio"] == pytest.approx(x["peer_tpot_ms"] / x["tpot_ms"])
        assert 0 < x["floor_ms"] and x["floor_pct"] == pytest.approx(100 * x["floor_ms"] / x["tpot_ms"])
        assert len(x["ttft_ms_all"]) == 2 and x["config"]["bench"]["batch"] == [1, 2]
        assert x["torch"] and x["git_commit"] and x["device_name"]
    rows = [ln for ln in (tmp_path / "results.md").read_text().splitlines() if ln.startswith("| eager |")]
    assert len(rows) == 2
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_compiled_peer_decodes_what_the_eager_peer_decodes() -> None:
    """bench.peer=compile: HF's decode step under torch.compile on a StaticCache (kept per batch size, emptied for
    each run) gives the greedy tokens of HF as it comes, run after run. Weights drawn wide so tokens vary."""
    from xrt.bench.clock import StepClock
    from xrt.bench.peer_hf import HfPeer
    from xrt.models.tiny import tiny_model_args

    cfg = XrtConfig(model=tiny_model_args(), device=Device.CPU,
                    bench=BenchArgs(input_len=8, output_len=6, peer=BenchPeer.COMPILE))
    device, clock = torch.device("cpu"), StepClock(torch.device("cpu"))
    eager = HfPeer(cfg, device, torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in eager.model.parameters():
            p.normal_(0.0, 0.5)
    compiled = HfPeer(cfg, device, torch.float32, compiled=True)
    compiled.model.load_state_dict(eager.model.state_dict())
    prompts = [[(7 * i + 3 * j) % 1000 for j in range(8)] for i in range(2)]
    eager.time_batch(clock, prompts, 6)
    for _ in range(2):
        timing = compiled.time_batch(clock, prompts, 6)
        assert compiled.last_tokens is not None and torch.equal(compiled.last_tokens, eager.last_tokens)
    assert eager.last_tokens.shape == (2, 6) and len(set(eager.last_tokens[0].tolist())) > 1
    assert timing.prefill_steps == 1 and timing.tpot_ms > 0
    md_row = _peer({"peer": "compile", "peer_tpot_ms": 1.5}, "tpot")
    assert md_row == "1.500 (compiled)" and _peer({"peer": "hf", "peer_tpot_ms": 1.5}, "tpot") == "1.500"


def test_cli_both_peers_in_one_job(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """bench.peer=both: our engine measured once, a record per peer and batch, each with its own peer's figures,
    and the table's compiled column marked (the plot draws a line per peer from the same records)."""
    r = _bench(capsys, tmp_path, "bench.batch=[1]", peer="both")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("[bench] hf batch 1:") == 1 and r.stdout.count("[bench] compile batch 1:") == 1
    assert r.stdout.count("[bench] eager batch 1: TTFT") == 2 and "HF compiled/ours" in r.stdout
    hf, compiled = _lines(tmp_path)
    assert (hf["peer"], compiled["peer"]) == ("hf", "compile")
    assert hf["ttft_ms_all"] == compiled["ttft_ms_all"] and hf["tpot_ms_all"] == compiled["tpot_ms_all"]
    assert hf["peer_tpot_ms_all"] != compiled["peer_tpot_ms_all"]
    for x in (hf, compiled):
        assert x["peer_tpot_ratio"] == pytest.approx(x["peer_tpot_ms"] / x["tpot_ms"])
    rows = [ln for ln in (tmp_path / "results.md").read_text().splitlines() if ln.startswith("| eager |")]
    assert len(rows) == 2 and "(compiled)" not in rows[0] and "(compiled)" in rows[1]
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_multirun_jobs_share_one_table_and_the_peer(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    r = _bench(capsys, tmp_path, "-m", "bench.batch=[1]", "model.max_model_len=512,1024", peer="hf")
    assert r.returncode == 0, r.stderr
    (sweep,) = [d for d in tmp_path.iterdir() if d.is_dir()]  # <bench.out_dir>/<date>_<time>
    lines = _lines(sweep)  # the jobs' lines, in job order
    assert [(x["batch"], x["config"]["model"]["max_model_len"]) for x in lines] == [(1, 512), (1, 1024)]
    assert [x["sweep"]["job"] for x in lines] == [0, 1] and [_lines(sweep / str(i)) for i in (0, 1)] == [
        lines[:1], lines[1:]]
    assert r.stdout.count("[bench] hf batch 1:") == 1  # job #1 reused job #0's peer figures
    assert lines[0]["peer_ttft_ms"] == lines[1]["peer_ttft_ms"] > 0
    rows = [ln for ln in (sweep / "results.md").read_text().splitlines() if ln.startswith("| eager")]
    labels = [ln.split("|")[1].strip() for ln in rows]
    assert labels == ["eager model.max_model_len=512", "eager model.max_model_len=1024"]  # as numbers


def test_cli_skips_a_batch_without_enough_kv_pages(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # 12 tokens per sequence = 1 page of 16; 4 pages hold batch 4 but not batch 5.
    r = _bench(capsys, tmp_path, "bench.batch=[4,5]", "cache.num_pages=4", "cache.page_size=16")
    assert r.returncode == 0, r.stderr
    status = {x["batch"]: x["status"] for x in _lines(tmp_path)}
    assert status == {4: "ok", 5: "skipped"}
    assert "skipped: needs 5 KV pages, the cache has 4" in (tmp_path / "results.md").read_text()


def test_cli_throughput_counts_every_token(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    r = _bench(capsys, tmp_path, "bench.scenario=throughput", "bench.num_requests=5", "bench.min_len=3",
               "bench.max_len=9", "bench.iters=1")
    assert r.returncode == 0, r.stderr
    (x,) = _lines(tmp_path)
    lens = random_lengths(5, 3, 9, seed=0)
    assert x["input_tokens"] == sum(i for i, _ in lens) and x["output_tokens"] == sum(o for _, o in lens)
    assert x["tokens_per_s"] == pytest.approx((x["input_tokens"] + x["output_tokens"]) / x["wall_s"])
    assert "| eager | qwen3-tiny |" in (tmp_path / "results.md").read_text()


def test_throughput_invocations_each_run_in_a_process_of_their_own(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    """bench.invocations=3: three processes, none of them this one; the record's tokens/s is the median invocation's,
    with each one's and their spread; the tokens counted are the scenario's."""
    r = _bench(capsys, tmp_path, "bench.scenario=throughput", "bench.num_requests=4", "bench.min_len=3",
               "bench.max_len=9", "bench.iters=1", "bench.invocations=3")
    assert r.returncode == 0, r.stderr
    (x,) = _lines(tmp_path)
    pids = x["invocation_pids"]
    assert len(set(pids)) == 3 and os.getpid() not in pids
    lens = random_lengths(4, 3, 9, seed=0)
    assert x["input_tokens"] == sum(i for i, _ in lens) and x["output_tokens"] == sum(o for _, o in lens)
    tps = x["tokens_per_s_invocations"]
    assert len(tps) == 3 and len(x["wall_s_all"]) == 3
    assert x["tokens_per_s"] == pytest.approx(statistics.median(tps))
    assert x["tokens_per_s_spread"] == pytest.approx((max(tps) - min(tps)) / statistics.median(tps))
    assert x["invocations"] == 3 and x["config"]["bench"]["invocations"] == 3
    md = (tmp_path / "results.md").read_text()
    assert f"| 3: {', '.join(f'{t:.0f}' for t in tps)} (" in md
    walls = x["wall_s_all"]
    assert f"| {x['wall_s']:.2f} ({min(walls):.2f}–{max(walls):.2f}) |" in md  # every run's spread beside the median


def test_cli_rejects_lengths_past_the_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    r = _bench(capsys, tmp_path, "bench.input_len=2000", "bench.output_len=100")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: bench.input_len + bench.output_len: must be <= model.max_position_embeddings=2048, got 2100")


@pytest.mark.parametrize("low,high", [(2.0, 9.0), (2.0, 3.0), (0.4, 300.0)])
def test_a_log_ms_axis_has_labelled_ticks_within_its_range(low: float, high: float) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from xrt.bench.figure import new_figure, style_axes

    fig, axes = new_figure(1, 1, 6)
    ax = axes[0][0]
    ax.plot([1, 8], [low, high], "o-", label="xrt")
    ax.set_yscale("log")
    style_axes(ax, [1, 8], "batch", "TTFT ms", "TTFT")
    fig.canvas.draw()
    y0, y1 = ax.get_ylim()
    shown = {t.get_text() for t in ax.yaxis.get_ticklabels(which="both")
             if t.get_text() and y0 <= t.get_position()[1] <= y1}
    assert len(shown) >= 2, shown  # matplotlib's default labels only powers of ten: none between 2 and 9
    assert all(float(text.replace("\N{MINUS SIGN}", "-")) > 0 for text in shown)  # plain numbers
    assert [t.get_text() for t in ax.xaxis.get_ticklabels(which="minor")] == []  # x: the batches alone
    plt.close(fig)
