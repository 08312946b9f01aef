"""How a tensor-parallel run ends when something goes wrong: a worker that raises mid-run or is killed fails the
run within seconds with one error naming the rank; Ctrl-C stops every rank; a tp the model cannot be split by
stops before any process starts. No process is left behind in any case (the CLI runs' processes are found by
a tag in their environment, so orphans would be found too)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from tp_helpers import (
    FailingCapture,
    FailingWarmUp,
    tagged_env,
    tagged_pids,
    tiny_config,
    tp_workers,
    wait_until,
    xrt_cli,
)

from xrt.config import CacheArgs, ExecutorArgs, ExecutorKind, ParallelArgs, SamplingArgs, XrtConfig
from xrt.distributed.driver import TPRunner
from xrt.distributed.errors import WorkerFailed
from xrt.engine.llm import LLM

FAILURE_S = 30  # the bound on noticing a failed worker; measured: well under a second


def config(path: str, tp: int, graphs: bool = False) -> XrtConfig:
    cfg = tiny_config(path, parallel=ParallelArgs(tp=tp, timeout_s=60), cache=CacheArgs(num_pages=64))
    if graphs:
        cfg.executor = ExecutorArgs(kind=ExecutorKind.CUDAGRAPH, buckets=[1, 2], max_batch=2)
    return cfg


def test_a_worker_raising_mid_run_fails_the_run_naming_the_rank(tiny_checkpoint: str) -> None:
    tp = TPRunner(config(tiny_checkpoint, 2, graphs=True), capture=FailingCapture(rank=1, after=5))
    llm = LLM(config(tiny_checkpoint, 2), runner=tp)
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"^tensor-parallel rank 1 failed: RuntimeError: injected failure at "
                                           r"replay 6$"):
        llm.generate([[1, 2, 3], [4, 5]], SamplingArgs(max_tokens=50, ignore_eos=True))
    assert time.monotonic() - start < FAILURE_S
    with pytest.raises(WorkerFailed, match="rank 1 failed"):  # the runner refuses further steps at once
        llm.generate([[1, 2, 3]], SamplingArgs(max_tokens=2))
    tp.close()
    assert not tp_workers()


def test_a_worker_failing_at_start_up_fails_the_start_naming_the_rank(tiny_checkpoint: str) -> None:
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match=r"^tensor-parallel rank 1 failed: MemoryError: injected: no room"):
        TPRunner(config(tiny_checkpoint, 2, graphs=True), capture=FailingWarmUp(rank=1))
    assert time.monotonic() - start < FAILURE_S
    assert not tp_workers()


def test_a_tp_the_model_cannot_split_stops_before_any_process_starts(
    tiny_checkpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from xrt.cli import main as cli
    from xrt.distributed.launch import Ranks

    def spawn(*args: object) -> None:
        raise AssertionError("spawned")

    monkeypatch.setattr(Ranks, "spawn", spawn)
    with pytest.raises(ValueError, match=r"^parallel\.tp: must divide model\.num_attention_heads=4, got 3"):
        LLM(config(tiny_checkpoint, 3))
    assert cli.main(["run", "device=cpu", "parallel.tp=3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: parallel.tp: must divide model.num_attention_heads=4, got 3"
    assert all(line.startswith("error: parallel.tp: must divide") for line in err)
    assert not tp_workers()


class Stderr:
    """A CLI run's stderr, read as it comes (to know when generation started)."""

    def __init__(self, stream) -> None:  # noqa: ANN001
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:  # noqa: ANN001
        for chunk in iter(lambda: stream.read(1), ""):
            self.text += chunk

    def lines(self) -> list[str]:
        self._thread.join(timeout=10)
        return [ln for ln in self.text.replace("\r", "\n").splitlines() if ln.strip()]


def generating_run(tmp_path: Path) -> tuple[str, object, Stderr]:
    """A tp=2 CLI run of 16 long generations, once it generates."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"prompt number {i}" for i in range(16)) + "\n")
    tag, env = tagged_env()
    proc = xrt_cli("run", "parallel.tp=2", "device=cpu", f"prompts_file={prompts}", "sampling.max_tokens=900",
                   "sampling.ignore_eos=true", env=env, stdout=subprocess.DEVNULL)  # results print as they finish:
    # an unread pipe would fill and block rank 0
    err = Stderr(proc.stderr)
    # Both ranks have their weights; the 16 x 900 tokens then take well over 10 s on this CPU.
    assert wait_until(lambda: err.text.count("loading weights") >= 2 or proc.poll() is not None, 120), err.text
    time.sleep(2)
    assert proc.poll() is None, err.text
    return tag, proc, err


def worker_pids(tag: str, parent: int) -> list[int]:
    found = []
    for pid in tagged_pids(tag):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == parent and b"spawn_main" in cmdline:
            found.append(pid)
    return found


def test_a_worker_killed_mid_run_ends_the_cli_run_with_one_error(tmp_path: Path, tiny_checkpoint: str) -> None:
    tag, proc, err = generating_run(tmp_path)
    (worker,) = worker_pids(tag, proc.pid)
    os.kill(worker, signal.SIGKILL)
    killed = time.monotonic()
    rc = proc.wait(timeout=FAILURE_S)
    took = time.monotonic() - killed
    lines = err.lines()
    assert rc == 1, lines
    assert lines[-1] == "error: tensor-parallel rank 1 died (killed by SIGKILL)"
    assert took < FAILURE_S
    assert wait_until(lambda: not tagged_pids(tag), 10), tagged_pids(tag)
    print(f"killed worker noticed, run ended in {took:.2f} s")


def test_ctrl_c_stops_every_rank(tmp_path: Path, tiny_checkpoint: str) -> None:
    tag, proc, err = generating_run(tmp_path)
    assert worker_pids(tag, proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole foreground group
    rc = proc.wait(timeout=FAILURE_S)
    assert rc == 130, err.lines()
    assert wait_until(lambda: not tagged_pids(tag), 10), tagged_pids(tag)
    assert not [ln for ln in err.lines() if "Traceback" in ln]
