"""The launchers, end to end through the CLI: two `xrt run parallel.tp=2` at once on one machine (each picks its
own free port) and `torchrun --nproc-per-node 2 -m xrt run parallel.tp=2` (xrt spawns nothing, rank 1 prints
nothing) all print what `xrt run` prints at tp=1; every process is gone afterwards. And `xrt bench -m
parallel.tp=1,2` records tp in every row."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tp_helpers import REPO, tagged_env, tagged_pids, tp_workers, wait_until, xrt_cli

TIMEOUT_S = 240


def generations(stdout: str) -> list[str]:
    """The printed generations (the summary line's timings differ from run to run)."""
    return [ln for ln in stdout.splitlines() if ln.startswith("[")]


def test_concurrent_spawned_runs_and_torchrun_print_what_one_rank_prints(
    tmp_path: Path, tiny_checkpoint_diverse: str
) -> None:
    prompts = tmp_path / "prompts.txt"
    words = "the model of the sea and a long story about".split()
    prompts.write_text("\n".join(" ".join(words[: 1 + i % len(words)] * (1 + i)) for i in range(6)) + "\n")
    args = ["device=cpu", f"model.path={tiny_checkpoint_diverse}", f"prompts_file={prompts}",
            "sampling.max_tokens=8"]
    tag, env = tagged_env()
    spawned = [xrt_cli("run", "parallel.tp=2", *args, env=env) for _ in range(2)]
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun is not installed")
    launched = subprocess.Popen(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "xrt", "run", "parallel.tp=2", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    one = subprocess.run([sys.executable, "-m", "xrt", "run", *args], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=TIMEOUT_S)
    assert one.returncode == 0, one.stderr
    want = generations(one.stdout)
    assert len(want) == 6
    for proc in [*spawned, launched]:
        out, err = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 0, err
        assert generations(out) == want, err
        assert len(out.splitlines()) == len(want) + 1  # and the summary line, once: rank 1 printed nothing
    assert wait_until(lambda: not tagged_pids(tag), 10), tagged_pids(tag)


def test_bench_sweeps_tp_and_records_it(tmp_path: Path, tiny_checkpoint: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from xrt.cli.main import main

    rc = main(["bench", "-m", "parallel.tp=1,2", "device=cpu", "model=qwen3-tiny", "model.dtype=float32",
               "bench.batch=[1,2]", "bench.input_len=8", "bench.output_len=4", "bench.warmup=0", "bench.iters=1",
               "bench.peer=none", f"hydra.sweep.dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    # The sweep's combined lines and table, built from its jobs' directories.
    rows = [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["tp"], r["batch"], r["status"]) for r in rows] == [(1, 1, "ok"), (1, 2, "ok"), (2, 1, "ok"),
                                                                 (2, 2, "ok")]
    assert all(r["tpot_ms"] > 0 for r in rows)
    table = (tmp_path / "results.md").read_text()
    assert "parallel.tp=2" in table and "parallel.tp=1" in table

    assert not tp_workers()  # the tp=2 job's workers went with its engine
