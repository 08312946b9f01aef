"""`-m` through Hydra's multirun on the tiny model (CPU): the basic, joblib and submitit_local launchers give the
same jobs, configs and combined table; the peer is measured once per shape across processes; Optuna optimises
the bench's objective; every job is checked before the first runs; `xrt bench report DIR` rebuilds a sweep's
table from its job directories wherever they ran."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from xrt.cli.main import main

REPO = Path(__file__).resolve().parents[2]
TINY = ["model=qwen3-tiny", "model.dtype=float32", "bench.batch=[1]", "bench.input_len=8", "bench.output_len=4",
        "bench.warmup=0", "bench.iters=1", "device=cpu"]
SWEEP = ["executor.overlap=true,false", "bench.peer=hf"]


def cli(*args: str) -> tuple[int, str, str]:
    """`python -m xrt ...` in this process: (exit status, stdout, stderr). Jobs that joblib or submitit run in
    other processes print there, not here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


@pytest.fixture
def workers_env(monkeypatch: pytest.MonkeyPatch, tiny_checkpoint: str, tmp_path: Path) -> Path:
    """Job processes (joblib's, submitit's) import this tree's xrt and find the session's tiny checkpoint."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def sweep(directory: Path, *args: str) -> tuple[str, str]:
    rc, out, err = cli("bench", "-m", *TINY, *SWEEP, f"hydra.sweep.dir={directory}", *args)
    assert rc == 0, err
    return out, err


def summary(directory: Path) -> list[tuple[Any, ...]]:
    """What a sweep's combined lines say apart from timings and where each job wrote."""
    out = []
    for r in lines(directory / "results.jsonl"):
        config = json.loads(json.dumps(r["config"]))
        assert config["bench"].pop("out_dir") == str((directory / str(r["sweep"]["job"])).resolve())
        out.append((r["sweep"]["job"], tuple(r["sweep"]["overrides"]), r["batch"], r["status"], r["executor"],
                    r["prefill_steps"], json.dumps(config, sort_keys=True), r["sweep"]["objective"]))
    return out


def table_rows(directory: Path) -> list[str]:
    return [ln.split("|")[1].strip() for ln in (directory / "results.md").read_text().splitlines()
            if ln.startswith("| eager")]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: str) -> tuple[Path, str]:
    """The sweep with Hydra's basic launcher: its jobs run one after the other in this process."""
    directory = tmp_path_factory.mktemp("basic") / "sweep"
    out, _ = sweep(directory)
    return directory, out


def test_the_basic_launcher_runs_each_job_in_its_directory_with_one_peer_measurement(
    in_process: tuple[Path, str],
) -> None:
    directory, out = in_process
    assert out.count("[bench] hf batch 1:") == 1  # job #1 took job #0's peer figures
    for num, overlap in ((0, True), (1, False)):
        job = directory / str(num)
        assert yaml.safe_load((job / ".hydra" / "config.yaml").read_text())["executor"]["overlap"] is overlap
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        (line,) = lines(job / "results.jsonl")
        assert line["sweep"]["overrides"] == overrides and f"executor.overlap={overlap}" in overrides
        assert line["config"]["executor"]["overlap"] is overlap
        assert line["sweep"]["value"] == pytest.approx(line["tpot_ms"])  # the objective: tpot_ms (auto)
    combined = lines(directory / "results.jsonl")
    assert combined[0]["peer_ttft_ms"] == combined[1]["peer_ttft_ms"] > 0
    assert table_rows(directory) == ["eager executor.overlap=False", "eager executor.overlap=True"]
    assert (directory / "plot.png").read_bytes()[:4] == b"\x89PNG"
    best = min(combined, key=lambda r: r["tpot_ms"])
    assert f"[bench] best tpot_ms: {best['tpot_ms']:.4g} (job #{best['sweep']['job']}: executor.overlap=" in out


@pytest.mark.parametrize("launcher", [
    ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],  # both jobs at once, in two processes
    ["hydra/launcher=submitit_local"],  # submitit's own subprocesses, as on a cluster's nodes
])
def test_process_launchers_give_the_in_process_results(
    in_process: tuple[Path, str], workers_env: Path, launcher: list[str]
) -> None:
    directory = workers_env / "sweep"
    sweep(directory, *launcher)
    assert summary(directory) == summary(in_process[0])
    assert table_rows(directory) == table_rows(in_process[0])
    # The peer measured once however the jobs ran: one line per shape and batch, both jobs' figures equal.
    assert len((directory / "peer.jsonl").read_text().splitlines()) == 1
    combined = lines(directory / "results.jsonl")
    assert combined[0]["peer_ttft_ms"] == combined[1]["peer_ttft_ms"] > 0


def test_a_sweep_leaves_logging_as_it_was(in_process: tuple[Path, str], tmp_path: Path) -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    rc, out, err = cli("bench", "-m", *TINY, "bench.peer=none", "seed=1,2", f"hydra.sweep.dir={tmp_path / 's'}")
    assert rc == 0, err
    assert (list(root.handlers), root.level) == before
    # Hydra's job log, in the job's directory: the lines that job printed, numbered as Hydra numbers it.
    for num in (0, 1):
        log = (tmp_path / "s" / str(num) / "bench.log").read_text()
        assert f"[stdout][INFO] - [bench] job #{num} of 2: wrote " in log and "[bench] eager batch 1: TTFT" in log
        assert f"job #{1 - num} " not in log
        assert f"[bench] job #{num} of 2: wrote {tmp_path / 's' / str(num) / 'results.jsonl'}" in out


def test_a_job_log_takes_each_line_once_as_last_drawn(tmp_path: Path) -> None:
    from xrt.cli.job_log import LineTee

    handler = logging.FileHandler(tmp_path / "job.log")
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    shown = io.StringIO()
    tee = LineTee(shown, [handler], "stderr")
    for part in ("[xrt] one", " line\n", "\r 10%", "\r100%\n", "\n", "no newline"):
        tee.write(part)
    tee.close_line()
    handler.close()
    assert shown.getvalue() == "[xrt] one line\n\r 10%\r100%\n\nno newline"  # the stream gets it all
    assert (tmp_path / "job.log").read_text() == "stderr: [xrt] one line\nstderr: 100%\nstderr: no newline\n"


def test_optuna_finds_the_best_batch_size_for_throughput(workers_env: Path) -> None:
    directory = workers_env / "optuna"
    rc, out, err = cli(
        "bench", "-m", *TINY, "bench.peer=none", "bench.scenario=throughput", "bench.num_requests=8",
        "bench.min_len=4", "bench.max_len=16", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=4",
        "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=0", "scheduler.max_num_seqs=choice(1,2,8)",
        f"hydra.sweep.dir={directory}")
    assert rc == 0, err
    assert "\x1b[" not in out + err and "alembic" not in out + err and "A new study created" not in out + err
    jobs = [lines(directory / str(i) / "results.jsonl")[0] for i in range(4)]
    assert not (directory / "4").exists()
    for job in jobs:  # each trial returned its measured throughput to the sweeper
        assert job["sweep"]["objective"] == "tokens_per_s" and job["sweep"]["value"] == job["tokens_per_s"] > 0
        assert job["config"]["scheduler"]["max_num_seqs"] in (1, 2, 8)
    best = max(jobs, key=lambda j: j["tokens_per_s"])
    result = yaml.safe_load((directory / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(best["tokens_per_s"])
    assert result["best_params"] == {"scheduler.max_num_seqs": best["config"]["scheduler"]["max_num_seqs"]}
    size = best["config"]["scheduler"]["max_num_seqs"]
    assert f"[bench] best tokens_per_s: {best['tokens_per_s']:.4g} (job #{best['sweep']['job']}: " \
           f"scheduler.max_num_seqs={size})" in out
    assert len(lines(directory / "results.jsonl")) == 4


def test_an_optuna_sweep_quiets_alembic_and_colours_only_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    optuna = pytest.importorskip("optuna")
    from xrt.cli.job_log import sweep_logging

    alembic, lib = logging.getLogger("alembic"), logging.getLogger("optuna")
    before = (alembic.level, lib.level)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    shown = {}
    for name, stream in (("pipe", io.StringIO()), ("tty", Terminal())):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(optuna.logging.create_default_formatter())  # optuna's own: colorlog, no stream
        monkeypatch.setattr(lib, "handlers", [handler])
        with sweep_logging("hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"):
            assert not alembic.isEnabledFor(logging.INFO) and not lib.isEnabledFor(logging.INFO)
            lib.warning("a trial failed")
        shown[name] = stream.getvalue()
        assert (alembic.level, lib.level) == before
    assert "a trial failed" in shown["pipe"] and "\x1b[" not in shown["pipe"]
    assert "\x1b[" in shown["tty"]  # a terminal keeps its colours


@pytest.mark.parametrize("args,text", [
    (["scheduler.max_num_seqs=4,0", "hydra/launcher=joblib"],
     "error: scheduler.max_num_seqs: must be >= 1, got 0 [job #1 of 2]"),
    (["hydra/sweeper=optuna", "hydra.sweeper.direction=maximize", "bench.scenario=throughput",
      "scheduler.max_num_seqs=int(interval(0,8))"],  # the search space's lower bound
     "error: scheduler.max_num_seqs: must be >= 1, got 0"),
    (["hydra/sweeper=optuna", "bench.scenario=throughput", "seed=choice(1,2)"],
     "error: hydra.sweeper.direction: bench.objective tokens_per_s is to maximize, the sweeper is set to "
     "minimize; add hydra.sweeper.direction=maximize"),
    (["hydra/sweeper=optuna", "bench.scenario=kernels", "seed=choice(1,2)"],
     "error: bench.objective: the kernels scenario returns no objective for the sweeper"),
    (["bench.input_len=8,3000"],  # what the bench refuses once started, found before the first job
     "error: bench.input_len + bench.output_len: must be <= model.max_position_embeddings=2048, got 3004 "
     "[job #1 of 2]"),
    (["seed=interval(1,4)"], "the basic sweeper runs a,b,c / range() / glob() sweeps; interval() needs a "
                             "sweeper that samples, e.g. hydra/sweeper=optuna"),
    (["hydra/launcher=jobib", "sede=1,2"], "error: sede: unknown field; did you mean seed?\n"
                                           "error: hydra/launcher: no option 'jobib' in group 'hydra/launcher'"),
])
def test_a_bad_sweep_stops_before_any_job_runs(tmp_path: Path, args: list[str], text: str) -> None:
    rc, out, err = cli("bench", "-m", *TINY, f"hydra.sweep.dir={tmp_path / 'sweep'}", *args)
    assert rc == 2 and out == "" and text in err, err
    assert not (tmp_path / "sweep").exists()


def test_a_job_failing_as_it_runs_fails_the_sweep_and_the_others_make_the_table(tmp_path: Path) -> None:
    # The kernels scenario finds it has no CUDA device only once its job runs.
    rc, out, err = cli("bench", "-m", *TINY, "bench.peer=none", "bench.scenario=latency,kernels",
                       f"hydra.sweep.dir={tmp_path / 's'}")
    assert rc == 2
    assert "error: bench.scenario: kernels times CUDA kernels and needs a CUDA device; none is available" in err
    assert [r["sweep"]["job"] for r in lines(tmp_path / "s" / "results.jsonl")] == [0]
    assert "(1 lines from 1 jobs)" in out and (tmp_path / "s" / "results.md").is_file()


def test_only_bench_jobs_can_be_optimised(tmp_path: Path) -> None:
    rc, _, err = cli("run", "-m", "hydra/sweeper=optuna", "seed=choice(1,2)", f"hydra.sweep.dir={tmp_path}/s")
    assert rc == 2 and "error: hydra/sweeper: hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper " \
                       "optimises the value a job returns; only bench jobs return one" in err


def test_a_sweep_dir_holding_an_earlier_sweep_is_refused(in_process: tuple[Path, str]) -> None:
    rc, out, err = cli("bench", "-m", *TINY, f"hydra.sweep.dir={in_process[0]}")
    assert rc == 2 and out == ""
    assert err.strip() == (f"error: hydra.sweep.dir: '{in_process[0]}' holds an earlier sweep's jobs (0, 1); "
                           f"choose another directory or remove them")


def test_report_rebuilds_a_sweep_whose_jobs_ran_elsewhere(in_process: tuple[Path, str], tmp_path: Path) -> None:
    # Two machines' job directories copied side by side; machine a's combined results.jsonl came along.
    shutil.copytree(in_process[0], tmp_path / "a")
    shutil.copytree(in_process[0] / "1", tmp_path / "b" / "7")
    rc, out, err = cli("bench", "report", str(tmp_path))
    assert rc == 0, err
    combined = lines(tmp_path / "results.jsonl")
    assert [(r["sweep"]["job"], r["config"]["executor"]["overlap"]) for r in combined] == [
        (0, True), (1, False), (1, False)]
    assert f"wrote {tmp_path / 'results.jsonl'} (3 lines from 3 jobs)" in out
    assert (tmp_path / "results.md").is_file() and (tmp_path / "plot.png").is_file()
    # A single run's lines beside the jobs would be lost by combining: refused, and nothing rewritten.
    single = lines(in_process[0] / "0" / "results.jsonl")[0]
    del single["sweep"]
    (tmp_path / "results.jsonl").write_text(json.dumps(single) + "\n")
    rc, out, err = cli("bench", "report", str(tmp_path))
    assert rc == 2 and "holds lines of its own besides the sweep jobs below it" in err
    assert len(lines(tmp_path / "results.jsonl")) == 1
    # A single run's results directory with another single run's below it (not a sweep): its own lines kept.
    other = tmp_path / "single"
    (other / "throughput").mkdir(parents=True)
    (other / "results.jsonl").write_text(json.dumps(single) + "\n")
    (other / "throughput" / "results.jsonl").write_text(json.dumps({**single, "batch": 9}) + "\n")
    assert cli("bench", "report", str(other))[0] == 0
    assert lines(other / "results.jsonl") == [single] and "| 1 |" in (other / "results.md").read_text()
    rc, out, err = cli("bench", "report", str(tmp_path / "b" / "nothing"))
    assert rc == 2 and err.splitlines()[0] == (f"error: {tmp_path / 'b' / 'nothing'}: no results.jsonl in it or in "
                                               f"a job directory below it")


def test_sweeper_params_in_a_primary_config_are_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    (conf / "layers.yaml").write_text(
        "defaults:\n  - bench\n  - _self_\nhydra:\n  sweeper:\n    params:\n      model.num_hidden_layers: 1,2\n")
    monkeypatch.setenv("XRT_CONF_DIR", str(conf))
    rc, out, err = cli("config", "validate", "-m", "--config-name", "layers", "seed=3,4")
    assert rc == 0, err
    assert out.splitlines() == ["job #0 of 4: model.num_hidden_layers=1 seed=3: ok",
                                "job #1 of 4: model.num_hidden_layers=1 seed=4: ok",
                                "job #2 of 4: model.num_hidden_layers=2 seed=3: ok",
                                "job #3 of 4: model.num_hidden_layers=2 seed=4: ok"]
    (conf / "layers.yaml").write_text(
        "defaults:\n  - bench\n  - _self_\nhydra:\n  sweeper:\n    params:\n      model.num_hidden_layers: 2,0\n")
    rc, out, err = cli("config", "validate", "-m", "--config-name", "layers")
    assert rc == 2 and "error: model.num_hidden_layers: must be > 0, got 0 [job #1 of 2]" in err
