"""The prefix scenario (TTFT by where the prefix comes from) on the tiny model: the CLI end to end, the tier each
phase's prefix came from, the L2 policy's choice after a restart, the page-cache drop and the disk probe, and
the bench fields' validation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from xrt.bench.disk import PROBE_FILE, drop_from_page_cache, probe_disk, resident_fraction
from xrt.bench.latency import build_engine
from xrt.bench.prefix import OUTPUT_TOKENS, PHASES, run_prefix
from xrt.bench.sweep_results import direction
from xrt.bench.tiers import L2_DIR, tier_manager
from xrt.cli.main import main
from xrt.config import BenchArgs, BenchObjective, BenchScenario, XrtConfig
from xrt.config.compose import load_config
from xrt.reflect import ConfigError

CHUNK = 16
# The tiny checkpoint (not dummy weights: its greedy tokens vary, so equal outputs across phases mean something).
PREFIX = [
    "model=qwen3-tiny",
    "model.dtype=float32",
    "model.load_format=auto",
    "bench.scenario=prefix",
    f"cache.chunk_tokens={CHUNK}",
    "cache.page_size=4",
    "bench.disk_probe_mb=1",
    "bench.warmup=1",
]


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]


def test_cli_prefix_measures_every_source_and_writes_table_and_plot(
    tiny_checkpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = main(["bench", *PREFIX, "bench.prefix_lens=[64,40]", "bench.iters=2", f"bench.out_dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    for phase in PHASES:
        assert f"iteration 2/2 {phase}: TTFT" in out
    assert "restart; L2 files" in out and "sequential write" in out
    rows = _lines(tmp_path)
    assert [r["prefix_len"] for r in rows] == [64, 40]
    for r in rows:
        n = r["prefix_len"]
        whole = n // CHUNK * CHUNK  # the prompt is n + 1 tokens: its whole chunks, the last token left to compute
        assert r["prompt_tokens"] == n + 1 and r["chunk_prefix_tokens"] == whole
        assert r["kv_bytes"] == (n + 1) * r["kv_bytes_per_token"] == (n + 1) * 3 * 2 * 2 * 16 * 4  # tiny, float32
        for run in r["runs"]:
            c = run["cached_tokens"]
            assert c["cold"] == c["tiered_cold"] == {"gpu": 0, "l1": 0, "l2": 0}
            assert c["gpu"] == {"gpu": n // 4 * 4, "l1": 0, "l2": 0}  # whole pages
            assert c["l1"] == {"gpu": 0, "l1": whole, "l2": 0}  # GPU prefix cache evicted: every chunk from L1
            assert c["l2"]["gpu"] == c["l2"]["l1"] == 0 and c["l2"]["l2"] == run["l2_tokens"]
            if run["l2_choice"] == "loaded":
                assert run["l2_tokens"] == whole and run["l2_load_gbps"] > 0  # every chunk came from L2
            elif run["l2_choice"] == "partly loaded":
                assert 0 < run["l2_tokens"] < whole
            else:  # the policy chose to recompute: it says so in its counters
                assert run["l2_choice"] == "recomputed" and run["l2_tokens"] == 0
                assert run["l2_skipped_slow"] + run["l2_abandoned_loads"] > 0
            assert run["page_cache"] in ("dropped", "partly", "unchecked")
            tokens = run["tokens"]
            assert set(tokens) == set(PHASES) and len(tokens["cold"]) == OUTPUT_TOKENS
            assert all(t == tokens["cold"] for t in tokens.values()) and run["outputs_identical"]
            assert run["restored_outputs_identical"]
        assert r["outputs_identical"] and r["l2_choice"] in ("loaded", "partly loaded", "recomputed", "mixed")
        assert r["l2_load_policy"] == "measured"
        assert r["tier_stats_tiered"]["hit_tokens_l1"] == 2 * whole
        assert r["tier_stats_restart"]["hit_tokens_l2"] == sum(x["l2_tokens"] for x in r["runs"])
        for phase in PHASES:
            assert len(r[f"{phase}_ttft_ms_all"]) == 2 and r[f"{phase}_ttft_ms"] > 0
            assert r[f"{phase}_ttft_frac"] == pytest.approx(r[f"{phase}_ttft_ms"] / r["cold_ttft_ms"])
        assert r["disk_read_gbps"] > 0 and r["disk_write_gbps"] > 0 and r["disk_probe_bytes"] == 16 << 20
        assert r["adjusted"]["cache.tiers"] == "l1_l2" and r["l1_size_gb"] == 4.0
    assert not (tmp_path / L2_DIR).exists()  # the bench's L2 chunks and probe file are gone
    md = (tmp_path / "results.md").read_text()
    assert "## Prefix: TTFT by where the prefix comes from, qwen3-tiny" in md
    table = [ln for ln in md.splitlines() if ln.startswith("| eager | 64 |")]
    assert len(table) == 2 and "identical" in table[0]  # the TTFT row and the tier stats row
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_a_restart_whose_l2_load_looks_slower_than_recompute_recomputes(tiny_checkpoint: str, tmp_path: Path) -> None:
    """The policy told storage is 1 byte/s: the restarted engine recomputes the prefix, and the row says so."""
    cfg = load_config(
        [*PREFIX, "bench.prefix_lens=[48]", "bench.iters=1", "bench.disk_probe_mb=0", f"bench.out_dir={tmp_path}"],
        config_name="bench",
    )
    built = []

    def slow_storage(c: XrtConfig) -> Any:
        engine = build_engine(c)
        tiers = tier_manager(engine)
        if tiers is not None:
            tiers.policy.l2_bandwidth = 1.0  # the restart's warm-up measures the prefill rate
        built.append(c.cache.tiers.value)
        return engine

    (r,) = run_prefix(cfg, lambda line: None, engine_factory=slow_storage)
    assert built == ["gpu", "l1_l2", "l1_l2"]  # cold; tiered cold / GPU / L1; the restart
    (run,) = r["runs"]
    assert r["l2_choice"] == run["l2_choice"] == "recomputed" and run["l2_tokens"] == 0
    assert run["cached_tokens"]["l2"] == {"gpu": 0, "l1": 0, "l2": 0} and run["l2_skipped_slow"] >= 1
    assert run["cached_tokens"]["l1"]["l1"] == 48 and r["outputs_identical"]
    assert "disk_read_gbps" not in r and r["l2_load_frac"] is None  # bench.disk_probe_mb=0: no probe


def test_prefix_with_tensor_parallelism(tiny_checkpoint: str, tmp_path: Path) -> None:
    """tp=2 over gloo: every phase runs on both ranks' tiers (rank 0 decides, each rank its own shard), the L1
    phase's prefix comes from both ranks' L1 and every phase gives the cold prefill's tokens."""
    rc = main(["bench", *PREFIX, "bench.prefix_lens=[48]", "bench.iters=1", "parallel.tp=2",
               "cache.l2.load_policy=always", f"bench.out_dir={tmp_path}"])
    assert rc == 0
    (row,) = _lines(tmp_path)
    assert row["tp"] == 2 and row["outputs_identical"]
    (run,) = row["runs"]
    assert run["cached_tokens"]["l1"] == {"gpu": 0, "l1": 48, "l2": 0}
    assert run["l2_choice"] == "loaded" and run["cached_tokens"]["l2"]["l2"] == 48


def test_page_cache_drop_is_checked_with_mincore(tmp_path: Path) -> None:
    f = tmp_path / "chunk.kv"
    f.write_bytes(os.urandom(1 << 20))
    before = resident_fraction(f)
    if before is None:
        pytest.skip("mincore is not available here")
    got = drop_from_page_cache([f])
    assert got["files"] == 1 and got["status"] in ("dropped", "partly")
    assert (got["status"] == "dropped") == (got["resident"] == 0)
    if got["status"] == "dropped":
        f.read_bytes()
        assert resident_fraction(f) == 1.0  # read back: cached again


def test_disk_probe_reads_what_it_wrote_and_removes_its_file(tmp_path: Path) -> None:
    got = probe_disk(tmp_path, 20)  # rounded up to whole 16 MiB blocks
    assert got["disk_probe_bytes"] == 32 << 20
    assert got["disk_read_gbps"] > 0 and got["disk_write_gbps"] > 0
    assert got["disk_read_mode"] == "O_DIRECT" or got["disk_read_mode"].startswith("buffered: ")
    assert not (tmp_path / PROBE_FILE).exists()


@pytest.mark.parametrize(
    "override,problem",
    [
        ("bench.prefix_lens=[]", ("bench.prefix_lens", "must list at least one prefix length, got []")),
        ("bench.prefix_lens=[64,0]", ("bench.prefix_lens", "element 1 must be >= 1, got 0")),
        ("bench.disk_probe_mb=-1", ("bench.disk_probe_mb", "must be >= 0, got -1")),
        (
            "bench.objective=tokens_per_s",
            (
                "bench.objective",
                "the prefix scenario does not measure tokens_per_s; expected one of l1_ttft_ms, l2_ttft_ms or auto",
            ),
        ),
    ],
)
def test_bad_prefix_fields_are_one_line_naming_the_field(override: str, problem: tuple[str, str]) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["bench.scenario=prefix", override], config_name="bench")
    assert e.value.problems == [problem]


def test_prefix_objectives_are_minimised_and_auto_is_l2_ttft() -> None:
    assert BenchArgs(scenario=BenchScenario.PREFIX).objective_metric() is BenchObjective.L2_TTFT_MS
    assert direction(BenchObjective.L2_TTFT_MS) == direction(BenchObjective.L1_TTFT_MS) == "minimize"
    with pytest.raises(ConfigError, match="the latency scenario does not measure l2_ttft_ms"):
        load_config(["bench.objective=l2_ttft_ms"], config_name="bench")


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["bench.prefix_lens=[64,8]"],
            "error: bench.prefix_lens: each must hold at least one cache.chunk_tokens=16 "
            "chunk (the unit the tiers store), got 8",
        ),
        (
            ["bench.prefix_lens=[4096]"],
            "error: bench.prefix_lens: the longest prompt (4096 + 1 tokens) and its 4 "
            "generated must fit model.max_position_embeddings=2048, got 4101",
        ),
        (
            ["cache.num_pages=8"],
            "error: cache.num_pages: the KV cache holds 32 tokens, a prompt of bench.prefix_lens=64 needs 69",
        ),
    ],
)
def test_a_prefix_run_it_cannot_measure_stops_with_one_line(
    args: list[str], line: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = main(["bench", *PREFIX, "bench.prefix_lens=[64]", "bench.iters=1", f"bench.out_dir={tmp_path}", *args])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == line


def test_a_sweep_finds_a_bad_prefix_length_before_its_first_job(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = main(["bench", "-m", *PREFIX, "bench.prefix_lens=[64],[8]", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert rc == 2
    assert (
        "error: bench.prefix_lens: each must hold at least one cache.chunk_tokens=16 chunk (the unit the tiers "
        "store), got 8 [job #1 of 2]"
    ) in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()
