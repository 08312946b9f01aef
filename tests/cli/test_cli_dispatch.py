"""Subcommand dispatch of `xrt.cli.main`, with stand-in run/bench/serve modules."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from xrt.cli import main as cli
from xrt.config import ExecutorKind, LoadFormat, XrtConfig


def fake_command(monkeypatch: pytest.MonkeyPatch, name: str, rc: int = 0) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    module = types.ModuleType(f"xrt.cli.{name}_cmd")
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)

    def main(cfg: XrtConfig) -> int:
        calls.append((cfg,))
        return rc

    def sweep_job(cfg: XrtConfig, job: Any) -> tuple[int, float | None]:
        calls.append((cfg, job))
        return rc, None

    module.main = main  # type: ignore[attr-defined]
    module.sweep_job = sweep_job  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return calls


def missing_command(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, f"xrt.cli.{name}_cmd", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == f"xrt.cli.{name}_cmd" else real(n, *a))


@pytest.mark.parametrize("name", ["run", "bench", "serve"])
def test_a_missing_subcommand_says_so_and_exits_2(name: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    missing_command(monkeypatch, name)
    assert cli.main([name]) == 2
    assert capsys.readouterr().err.strip() == f"xrt {name}: not available yet"


def test_run_gets_the_composed_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    calls = fake_command(monkeypatch, "run")
    assert cli.main(["run", "prompt='hi there'", "sampling.max_tokens=3", "device=cpu"]) == 0
    (cfg,) = calls[0]
    assert cfg.prompt == "hi there" and cfg.sampling.max_tokens == 3 and cfg.model.name == "qwen3-tiny"
    assert list(tmp_path.iterdir()) == []


def test_bench_uses_bench_yaml_and_multirun_runs_one_job_per_combination(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    calls = fake_command(monkeypatch, "bench")
    assert cli.main(["bench", "-m", "bench.batch=1,8", "model.num_hidden_layers=2,4", "device=cpu"]) == 0
    assert [(c[0].bench.batch, c[0].model.num_hidden_layers, c[1].num, c[1].num_jobs) for c in calls] == [
        ([1], 2, 0, 4), ([1], 4, 1, 4), ([8], 2, 2, 4), ([8], 4, 3, 4)]
    assert all(c[0].model.load_format is LoadFormat.DUMMY and c[0].model.name == "qwen3" for c in calls)
    # Hydra's job directories under the bench's default sweep directory, <bench.out_dir>/<date>_<time>
    (sweep,) = (tmp_path / "bench" / "results" / "latest").iterdir()
    assert [c[1].job_dir for c in calls] == [sweep / str(i) for i in range(4)]
    assert calls[3][1].overrides == ["bench.batch=8", "model.num_hidden_layers=4", "device=cpu"]


def test_single_bench_run_gets_its_config_and_its_status_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_command(monkeypatch, "bench", rc=3)
    assert cli.main(["bench", "--config-name", "config", "device=cpu"]) == 3
    assert calls[0][0].model.name == "qwen3-tiny" and len(calls) == 1


def test_config_errors_stop_a_sweep_before_any_job_runs(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    calls = fake_command(monkeypatch, "bench")
    assert cli.main(["bench", "-m", "parallel.tp=1,3", "device=cpu"]) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert "error: parallel.tp: must divide model.num_attention_heads=16, got 3 [job #1 of 2]" in err


def test_cudagraph_needs_cuda_when_running_and_validating_not_when_composing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    calls = fake_command(monkeypatch, "run")
    assert cli.main(["config", "show", "executor=cudagraph"]) == 0
    capsys.readouterr()
    for command in (["config", "validate"], ["run"]):  # validate refuses what run refuses, with the same line
        assert cli.main([*command, "executor=cudagraph"]) == 2
        assert capsys.readouterr().err.startswith("error: executor.kind: cudagraph needs a CUDA device")
    assert calls == []


@pytest.mark.parametrize("option", ["l1", "l1_l2"])
def test_a_cache_tier_option_runs_with_its_tiers(option: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_command(monkeypatch, "run")
    assert cli.main(["run", "device=cpu", f"cache={option}"]) == 0
    assert [c[0].cache.tiers.value for c in calls] == [option]


def test_a_tensor_parallel_setting_that_cannot_run_stops_before_running(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    calls = fake_command(monkeypatch, "run")
    assert cli.main(["run", "device=cpu", "parallel.tp=3"]) == 2
    assert "error: parallel.tp: must divide model.num_attention_heads=4, got 3" in capsys.readouterr().err
    assert cli.main(["run", "device=cpu", "parallel.tp=2", "parallel.backend=nccl"]) == 2
    assert "error: parallel.backend: nccl needs CUDA devices" in capsys.readouterr().err
    assert calls == []


@pytest.mark.parametrize("flags,level", [((), "info"), (("-v",), "debug"), (("-q",), "warning"),
                                         (("--quiet", "log_level=error"), "warning"), (("log_level=error",), "error")])
def test_verbosity_flags_are_the_log_level_field_and_apply_to_the_run(
        flags: tuple[str, ...], level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    xrt_logger = logging.getLogger("xrt")
    monkeypatch.setattr(xrt_logger, "level", xrt_logger.level)
    calls = fake_command(monkeypatch, "run")
    assert cli.main(["run", *flags, "device=cpu"]) == 0
    assert calls[0][0].log_level.value == level
    assert xrt_logger.getEffectiveLevel() == logging.getLevelName(level.upper())
    assert cli.main(["config", "fields", *(f for f in flags if f.startswith("-"))]) == 0  # fine where no overrides are


def test_config_error_from_a_subcommand_is_clean(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from xrt.reflect import ConfigError

    module = types.ModuleType("xrt.cli.run_cmd")
    module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)

    def main(cfg: XrtConfig) -> int:
        raise ConfigError([("prompts_file", "no such file: 'x.jsonl'")])

    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert cli.main(["run", "device=cpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: prompts_file: no such file: 'x.jsonl'"


def test_executor_kind_is_passed_through(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_command(monkeypatch, "serve")
    assert cli.main(["serve", "executor=eager", "device=cpu"]) == 0
    assert calls[0][0].executor.kind is ExecutorKind.EAGER and len(calls[0]) == 1
