"""The multiturn scenario on the tiny model: conversations whose KV outgrows a small GPU cache, per cache.tiers
setting: identical greedy outputs, the prefixes served from L1/L2 when the tiers are on, the figures' arithmetic,
a detected output mismatch, the objective a sweep gets, and the fields' validation."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from xrt.bench.latency import build_engine
from xrt.bench.multiturn import run_multiturn
from xrt.bench.sweep_results import direction
from xrt.bench.tiers import L2_DIR
from xrt.cli.main import main
from xrt.config import BenchArgs, BenchObjective, BenchScenario, SamplingArgs, XrtConfig
from xrt.config.compose import load_config
from xrt.reflect import ConfigError

CLIENTS, ROUNDS, TURN, OUT = 6, 4, 16, 4
# 40 pages of 4 tokens hold 160; the conversations end at 6 x 4 x (16 + 4) = 480. L1 of 0.00004 GB holds 3 chunks of
# 16 tokens (768 bytes a token), so L2 serves the rest.
MULTITURN = [
    "model=qwen3-tiny",
    "model.dtype=float32",
    "model.load_format=auto",
    "bench.scenario=multiturn",
    f"bench.clients={CLIENTS}",
    f"bench.rounds={ROUNDS}",
    f"bench.turn_len={TURN}",
    f"bench.output_len={OUT}",
    "cache.chunk_tokens=16",
    "cache.page_size=4",
    "cache.num_pages=40",
    "cache.l1.size_gb=0.00004",
]


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]


def test_cli_multiturn_gives_identical_outputs_and_tier_hits_past_the_gpu_cache(
    tiny_checkpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = main(["bench", *MULTITURN, "bench.compare_tiers=[gpu,l1_l2]", f"bench.out_dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"multiturn l1_l2: round {ROUNDS}/{ROUNDS}" in out and "multiturn l1_l2: working set 480 tokens" in out
    # the device's KV named for it (CPU here), every capacity in tokens and bytes (768 bytes a token)
    assert "multiturn l1_l2: working set 480 tokens (369 kB), CPU KV 160 tokens (40 pages, 123 kB), L1 + L2 " in out
    assert "GPU" not in out
    gpu, tiered = _lines(tmp_path)
    assert (gpu["tiers"], tiered["tiers"]) == ("gpu", "l1_l2")
    prompt_tokens = CLIENTS * sum(r * (TURN + OUT) + TURN for r in range(ROUNDS))
    for r in (gpu, tiered):
        assert r["requests"] == CLIENTS * ROUNDS and r["requests_per_s"] == pytest.approx(r["requests"] / r["wall_s"])
        assert r["prompt_tokens"] == prompt_tokens and r["output_tokens"] == CLIENTS * ROUNDS * OUT
        assert r["tokens_per_s"] == pytest.approx((prompt_tokens + r["output_tokens"]) / r["wall_s"])
        assert r["computed_prompt_tokens"] == prompt_tokens - sum(r["cached_tokens"].values())
        assert r["working_set_tokens"] == CLIENTS * ROUNDS * (TURN + OUT) == 480 > r["gpu_kv_tokens"] == 160
        assert r["outputs_identical"] and r["mismatched_requests"] == 0 and r["compared_with"] == "gpu"
        assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0
        st = r["steps"]  # where the time went: every step() call is one or the other, all inside the rounds
        assert st["prefill_steps"] >= ROUNDS and st["decode_steps"] >= ROUNDS * (OUT - 1)
        assert 0 < st["prefill_s"] + st["decode_s"] <= r["wall_s"]
        assert 1 <= st["decode_batch_mean"] <= CLIENTS
        assert st["decode_rows"] <= r["output_tokens"]
    assert gpu["cached_tokens"]["l1"] == gpu["cached_tokens"]["l2"] == 0 and gpu["l1_tokens"] == gpu["l2_tokens"] == 0
    # the histories past the GPU pages come back from the tiers: fewer prompt tokens computed than without them (how
    # many from L2 depends on how far its writer thread got by the next round)
    assert tiered["cached_tokens"]["l1"] + tiered["cached_tokens"]["l2"] > 0
    assert tiered["computed_prompt_tokens"] < gpu["computed_prompt_tokens"]
    assert any(v > 0 for k, v in tiered["tier_stats"].items() if k.startswith("stored") and k.endswith("l2"))
    assert tiered["l1_tokens"] == 3 * 16 and tiered["l2_tokens"] > 0
    assert gpu["requests_per_s_ratio"] == 1.0
    assert tiered["requests_per_s_ratio"] == pytest.approx(tiered["requests_per_s"] / gpu["requests_per_s"])
    assert not (tmp_path / L2_DIR).exists()
    md = (tmp_path / "results.md").read_text()
    assert f"## Multiturn: qwen3-tiny, {CLIENTS} clients x {ROUNDS} rounds, turn {TURN}, output {OUT}" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| eager | ")]
    assert [ln.split("|")[2].strip() for ln in rows] == ["gpu", "l1_l2"]
    assert all("identical vs gpu" in ln for ln in rows)
    assert "| working set tokens | CPU KV tokens | L1 + L2 tokens |" in md
    st = tiered["steps"]
    assert f"| {st['prefill_s']:.2f} ({st['prefill_steps']}) | {st['decode_s']:.2f} ({st['decode_steps']}, " in rows[1]
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


class _Altered:
    """An engine whose outputs have their last token changed: what a tier serving wrong KV would look like."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.runner, self.scheduler = engine.runner, engine.scheduler

    def close(self) -> None:
        self.engine.close()

    def add_request(self, prompt: list[int], sampling: SamplingArgs) -> int:
        return self.engine.add_request(prompt, sampling)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> Sequence[Any]:
        return [
            dataclasses.replace(o, token_ids=[*o.token_ids[:-1], (o.token_ids[-1] + 1) % 2048])
            for o in self.engine.step()
        ]


def test_outputs_that_differ_between_settings_are_counted(tiny_checkpoint: str, tmp_path: Path) -> None:
    cfg = load_config(
        [*MULTITURN, "bench.compare_tiers=[gpu,l1]", "bench.rounds=2", "bench.warmup=0", f"bench.out_dir={tmp_path}"],
        config_name="bench",
    )

    def factory(c: XrtConfig) -> Any:
        engine = build_engine(c)
        return _Altered(engine) if c.cache.tiers.value == "l1" else engine

    gpu, l1 = run_multiturn(cfg, lambda line: None, engine_factory=factory)
    assert gpu["outputs_identical"] and not l1["outputs_identical"]
    assert l1["mismatched_requests"] == CLIENTS * 2


def test_a_sweep_job_returns_the_last_settings_requests_per_s(
    tiny_checkpoint: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    rc = main(
        [
            "bench",
            "-m",
            *MULTITURN,
            "bench.rounds=2",
            "bench.compare_tiers=[gpu,l1],[l1,gpu]",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    for job, last in ((0, "l1"), (1, "gpu")):
        lines = _lines(sweep / str(job))
        (row,) = [x for x in lines if x["tiers"] == last]
        assert all(x["sweep"]["objective"] == "requests_per_s" for x in lines)
        assert all(x["sweep"]["value"] == row["requests_per_s"] for x in lines)
    assert "[bench] best requests_per_s: " in out
    assert BenchArgs(scenario=BenchScenario.MULTITURN).objective_metric() is BenchObjective.REQUESTS_PER_S
    assert direction(BenchObjective.REQUESTS_PER_S) == "maximize"


@pytest.mark.parametrize(
    "override,problem",
    [
        (
            "bench.compare_tiers=[]",
            ("bench.compare_tiers", "must list at least one cache.tiers setting (gpu, l1, l1_l2), got []"),
        ),
        (
            "bench.compare_tiers=[gpu,l1_l2,gpu]",
            ("bench.compare_tiers", "lists gpu more than once, got [gpu, l1_l2, gpu]"),
        ),
        ("bench.compare_tiers=[gpu,l3]", ("bench.compare_tiers[1]", "must be one of gpu, l1, l1_l2, got 'l3'")),
        ("bench.clients=0", ("bench.clients", "must be >= 1, got 0")),
        ("bench.rounds=0", ("bench.rounds", "must be >= 1, got 0")),
        ("bench.turn_len=0", ("bench.turn_len", "must be >= 1, got 0")),
        (
            "bench.objective=tpot_ms",
            (
                "bench.objective",
                "the multiturn scenario does not measure tpot_ms; expected one of requests_per_s or auto",
            ),
        ),
    ],
)
def test_bad_multiturn_fields_are_one_line_naming_the_field(override: str, problem: tuple[str, str]) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["bench.scenario=multiturn", override], config_name="bench")
    assert e.value.problems == [problem]


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["cache.num_pages=10"],
            "error: cache.num_pages: the KV cache holds 40 tokens, a client's last round needs 80 "
            "(bench.rounds * (bench.turn_len + bench.output_len))",
        ),
        (
            ["bench.turn_len=1000"],
            "error: bench.rounds * (bench.turn_len + bench.output_len): must be <= "
            "model.max_position_embeddings=2048, got 4016",
        ),
    ],
)
def test_a_multiturn_run_it_cannot_measure_stops_with_one_line(
    args: list[str], line: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc = main(["bench", *MULTITURN, f"bench.out_dir={tmp_path}", *args])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == line
