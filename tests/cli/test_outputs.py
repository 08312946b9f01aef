"""Nothing lost: `output` and `bench.out_dir` are checked before any model loads, run's results reach the file
as each request finishes (a Ctrl-C keeps them), and a sweep's jobs never overwrite each other's files."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xrt.cli.main import main

REPO = Path(__file__).resolve().parents[2]
TINY_BENCH = ["model=qwen3-tiny", "model.dtype=float32", "bench.input_len=8", "bench.output_len=4", "bench.warmup=0",
              "bench.iters=1", "bench.batch=[1]"]


def cli(*args: str) -> tuple[int, str, str]:
    """`python -m xrt ...` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_checkpoint: str) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("first prompt\nsecond prompt\n")
    (tmp_path / "a_file").write_text("not a directory\n")
    (tmp_path / "a_dir").mkdir()
    return tmp_path


@pytest.mark.parametrize("output,text", [
    ("a_dir", "output: 'a_dir' is a directory; expected a file path such as a_dir/out.jsonl"),
    ("missing/o.jsonl", "does not exist; create it or choose another path"),
    ("a_file/o.jsonl", "is not a directory, so 'a_file/o.jsonl' cannot be written"),
    ("p.txt", "output: 'p.txt' is the prompts_file; writing there would overwrite the prompts"),
    ("./a_dir/../p.txt", "is the prompts_file"),
])
def test_a_bad_output_stops_before_the_model_loads(in_tmp: Path, output: str, text: str) -> None:
    before = sorted(os.listdir(in_tmp))
    rc, out, err = cli("run", "prompts_file=p.txt", f"output={output}", "device=cpu")
    assert rc == 2 and out == ""  # no "startup" line: the model never loaded
    assert err.count("\n") == 1 and err.startswith("error: output: ") and text in err
    assert sorted(os.listdir(in_tmp)) == before and (in_tmp / "p.txt").read_text() == "first prompt\nsecond prompt\n"


def test_output_through_a_symlink_to_the_prompts_is_refused(in_tmp: Path) -> None:
    (in_tmp / "link.txt").symlink_to(in_tmp / "p.txt")
    rc, _, err = cli("run", "prompts_file=p.txt", "output=link.txt")
    assert rc == 2 and "is the prompts_file" in err
    assert (in_tmp / "p.txt").read_text() == "first prompt\nsecond prompt\n"


def test_an_existing_output_is_refused_unless_output_overwrite(in_tmp: Path) -> None:
    (in_tmp / "o.jsonl").write_text('{"kept": true}\n')
    rc, out, err = cli("run", "prompts_file=p.txt", "output=o.jsonl", "sampling.max_tokens=2")
    assert rc == 2 and out == ""
    assert err == "error: output: 'o.jsonl' exists; choose another path, or set output_overwrite=true to replace it\n"
    assert (in_tmp / "o.jsonl").read_text() == '{"kept": true}\n'
    rc, _, err = cli("run", "prompts_file=p.txt", "output=o.jsonl", "output_overwrite=true", "sampling.max_tokens=2")
    assert rc == 0, err
    assert [r["prompt"] for r in sorted(records(in_tmp / "o.jsonl"), key=lambda r: r["request_id"])] == [
        "first prompt", "second prompt"]


def test_a_run_that_stops_early_leaves_an_earlier_output_alone(in_tmp: Path) -> None:
    (in_tmp / "o.jsonl").write_text('{"kept": true}\n')
    rc, _, err = cli("run", "prompts_file=missing.txt", "output=o.jsonl", "output_overwrite=true")
    assert rc == 2 and "prompts_file: no such file" in err
    assert (in_tmp / "o.jsonl").read_text() == '{"kept": true}\n'


def test_output_is_tried_for_real_and_tilde_is_expanded(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # os.access says /proc is writable for root; creating a file there fails.
    rc, out, err = cli("run", "output=/proc/xrt-out.jsonl")
    assert rc == 2 and out == "" and err.startswith("error: output: cannot write '/proc/xrt-out.jsonl' (")
    monkeypatch.setenv("HOME", str(in_tmp / "a_dir"))
    rc, _, err = cli("run", "prompts_file=~/../p.txt", "output=~/o.jsonl", "sampling.max_tokens=2")
    assert rc == 0, err
    assert len(records(in_tmp / "a_dir" / "o.jsonl")) == 2 and not (in_tmp / "~").exists()


def test_every_result_is_one_jsonl_line(in_tmp: Path) -> None:
    # One request at a time: the repeated prompt finds the first one's pages in the prefix cache.
    (in_tmp / "r.txt").write_text("the same prompt, long enough to fill two pages of sixteen tokens each\n" * 2)
    rc, out, err = cli("run", "prompts_file=r.txt", "output=o.jsonl", "sampling.max_tokens=2",
                       "scheduler.max_num_seqs=1")
    assert rc == 0, err
    got = sorted(records(in_tmp / "o.jsonl"), key=lambda r: r["request_id"])
    assert [r["request_id"] for r in got] == [0, 1]
    assert all(len(r["token_ids"]) == 2 and r["num_preemptions"] == 0 for r in got)
    assert got[0]["num_cached_tokens"] == 0 and got[1]["num_cached_tokens"] >= 16
    assert got[1]["cached_tokens"] == {"gpu": got[1]["num_cached_tokens"]}
    assert out.splitlines()[-1] == "wrote 2 results to o.jsonl"


def test_ctrl_c_keeps_the_results_that_finished(in_tmp: Path) -> None:
    # One request at a time, long enough that the run is still going when the first lines are on disk.
    (in_tmp / "many.txt").write_text("".join(f"prompt number {i}\n" for i in range(300)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "xrt", "run", "prompts_file=many.txt", "output=o.jsonl", "scheduler.max_num_seqs=1",
         "sampling.max_tokens=32", "sampling.ignore_eos=true"],
        cwd=in_tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_file, deadline = in_tmp / "o.jsonl", time.monotonic() + 90
    while proc.poll() is None and time.monotonic() < deadline:
        if out_file.exists() and len(out_file.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    kept = records(out_file)  # every line is whole JSON
    assert 2 <= len(kept) < 300 and len({r["request_id"] for r in kept}) == len(kept)
    assert f"interrupted: {len(kept)} of 300 requests finished; their results are in o.jsonl" in err
    # The terminal kept them too: each printed as it finished, naming its request (the signal may land between
    # the file's line and the terminal's).
    printed = [int(line[1:line.index("]")]) for line in out.splitlines() if line.startswith("[")]
    assert set(printed) <= {r["request_id"] for r in kept} and len(printed) >= len(kept) - 1
    assert all(f"'prompt number {i}' -> " in out for i in printed)


def test_a_sweep_writes_one_output_per_job(in_tmp: Path) -> None:
    rc, out, err = cli("run", "-m", "sampling.temperature=0,0.8", "prompts_file=p.txt", "output=o.jsonl",
                       "sampling.max_tokens=2")
    assert rc == 0, err
    assert not (in_tmp / "o.jsonl").exists()
    assert [len(records(in_tmp / f"o.{i}.jsonl")) for i in (0, 1)] == [2, 2]
    assert "wrote 2 results to o.0.jsonl" in out and "wrote 2 results to o.1.jsonl" in out


def output_lines(*args: str) -> list[str]:
    rc, out, err = cli("config", "show", "-m", *args)
    assert rc == 0, err
    return [line for line in out.splitlines() if line.startswith("output:")]


def test_sweep_outputs_are_numbered_only_where_jobs_share_one() -> None:
    assert output_lines("seed=1,2", "output=out/o.jsonl") == ["output: out/o.0.jsonl", "output: out/o.1.jsonl"]
    assert output_lines("output=a.jsonl,b.jsonl") == ["output: a.jsonl", "output: b.jsonl"]
    assert output_lines("output=o.jsonl") == ["output: o.jsonl"]  # one job: its name as given
    assert output_lines("seed=range(0,11)", "output=o")[::10] == ["output: o.00", "output: o.10"]  # 11 jobs: #0..#10
    assert output_lines("seed=1,2") == ["output: ''", "output: ''"]


def test_sweep_outputs_that_collide_are_refused() -> None:
    rc, out, err = cli("config", "validate", "-m", "output=o.jsonl,o.jsonl,o.1.jsonl")
    assert rc == 2 and out == ""
    assert err.splitlines() == ["error: output: 'o.1.jsonl' is written by job #1 too [job #2 of 3]"]
    # job #0 would overwrite job #1's prompts before job #1 reads them
    rc, _, err = cli("config", "validate", "-m", "prompts_file=q.txt,o.0.jsonl", "output=o.jsonl")
    assert rc == 2 and "error: output: 'o.0.jsonl' is the prompts_file of job #1 [job #0 of 2]" in err


@pytest.mark.parametrize("multirun,out_dir,text", [
    (False, "a_file", "error: bench.out_dir: 'a_file' is a file; expected a directory"),
    (False, "a_file/sub", "is a file, so 'a_file/sub' cannot be made"),
    # a sweep writes under hydra.sweep.dir, by default <bench.out_dir>/<date>_<time>
    (True, "a_file", "error: hydra.sweep.dir: "),
    (True, "a_file/sub", "is a file, so 'a_file/sub/"),
])
def test_a_bad_out_dir_stops_the_bench_before_measuring(in_tmp: Path, multirun: bool, out_dir: str,
                                                        text: str) -> None:
    sweep = ["-m", "seed=1,2"] if multirun else []
    rc, out, err = cli("bench", *sweep, *TINY_BENCH, f"bench.out_dir={out_dir}")
    assert rc == 2 and out == "" and "[bench]" not in err
    assert err.startswith("error: ") and text in err and len(err.splitlines()) == 1
    assert (in_tmp / "a_file").read_text() == "not a directory\n"


def test_a_bench_sweep_over_out_dir_is_refused_for_hydra_sweep_dir(in_tmp: Path) -> None:
    rc, out, err = cli("bench", "-m", *TINY_BENCH, "bench.out_dir=a,b")
    assert rc == 2 and out == ""
    assert err.startswith("error: bench.out_dir: a sweep writes its jobs' results under hydra.sweep.dir "
                          "(bench/results/latest/")
    assert "run one sweep per directory, with hydra.sweep.dir=DIR" in err and not (in_tmp / "a").exists()


def test_a_terminal_without_utf8_gets_escapes_not_a_traceback(in_tmp: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "ascii"}
    r = subprocess.run([sys.executable, "-m", "xrt", "run", "caf\u00e9 \u2615", "sampling.max_tokens=2"], cwd=in_tmp,
                       env=env, capture_output=True, text=True, encoding="utf-8", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[0] 'caf\\xe9 \\u2615' -> " in r.stdout and "Traceback" not in r.stderr
