"""Progress (xrt/progress.py): log lines where stderr is not a terminal (when, and what they say), the bar's
estimate on a terminal, and the first run of the tiny model in a subprocess whose stderr is a pipe."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from xrt import progress
from xrt.progress import Bar, Progress, format_bytes

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_log_lines_at_quarters_and_every_few_seconds_once_a_second_has_passed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = Clock()
    with Progress(100, "loading weights", "tensor", total_bytes=2_400_000_000, tty=False, clock=clock) as p:
        clock.t += 0.5
        p.update(30, 720_000_000)  # a quarter done, but within the first second: no line
        assert _lines(capsys) == []
        clock.t += 0.7
        p.update(1, 24_000_000)  # past a second, and past a quarter not yet logged
        assert _lines(capsys) == ["[xrt] loading weights: 31/100 tensors, 0.7/2.4 GB, 1 s"]
        clock.t += 1.0
        p.update(1, 24_000_000)  # same quarter, 1 s later
        assert _lines(capsys) == []
        clock.t += progress.LOG_EVERY_S
        p.update(1, 24_000_000)  # same quarter, LOG_EVERY_S later
        assert _lines(capsys) == ["[xrt] loading weights: 33/100 tensors, 0.8/2.4 GB, 7 s"]
        clock.t += 0.1
        p.update(20, 480_000_000)  # the half
        assert _lines(capsys) == ["[xrt] loading weights: 53/100 tensors, 1.3/2.4 GB, 7 s"]
        clock.t += 0.1
        p.update(47, 1_128_000_000)  # done: left to the final line
        assert _lines(capsys) == []
        clock.t += 0.3
    assert _lines(capsys) == ["[xrt] loading weights: 100/100 tensors, 2.4/2.4 GB in 7.70 s"]


def test_a_short_run_logs_one_line_and_hidden_or_failed_runs_none(capsys: pytest.CaptureFixture[str]) -> None:
    with Progress(3, "generating", "request", tty=False) as p:
        for _ in range(3):
            p.update()
        p.set_postfix("tok_s=12.5")
    (line,) = _lines(capsys)
    assert re.fullmatch(r"\[xrt\] generating: 3/3 requests, tok_s=12\.5 in \d+\.\d\d s", line), line
    with Progress(3, "capturing decode CUDA graphs", "graph", tty=False, final=False) as p:
        p.update(3)
    with Progress(3, "generating", "request", tty=False, show=False) as p:
        p.update(3)
    with pytest.raises(RuntimeError), Progress(3, "loading weights", "tensor", tty=False) as p:
        p.update()
        raise RuntimeError("corrupt file")
    assert _lines(capsys) == []


def test_poll_logs_what_moved_although_no_unit_finished(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    with Progress(300, "generating", "request", tty=False, clock=clock) as p:
        p.set_postfix("120 tokens, 60.0 tok/s")
        clock.t += 2.0
        p.poll()
        assert _lines(capsys) == []  # within LOG_EVERY_S of the start
        clock.t += progress.LOG_EVERY_S
        p.poll()  # no request finished, the tokens moved: a line
        assert _lines(capsys) == [f"[xrt] generating: 0/300 requests, 120 tokens, 60.0 tok/s, "
                                  f"{2 + progress.LOG_EVERY_S:.0f} s"]
        p.set_postfix("300 tokens, 75.0 tok/s")
        clock.t += 1.0
        p.poll()
        assert _lines(capsys) == []  # within LOG_EVERY_S of the last line
        clock.t += progress.LOG_EVERY_S
        p.poll()
        assert _lines(capsys) == [f"[xrt] generating: 0/300 requests, 300 tokens, 75.0 tok/s, "
                                  f"{3 + 2 * progress.LOG_EVERY_S:.0f} s"]
        p.update(300)


def test_poll_redraws_the_bar_with_the_new_postfix(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    with Progress(300, "generating", "request", tty=True, clock=clock) as p:
        p.set_postfix("512 tokens")
        clock.t += 1.0
        p.poll()
        assert "512 tokens" in capsys.readouterr().err


def test_bytes_are_shown_in_the_unit_of_the_total() -> None:
    assert format_bytes(1.2e9, 2.4e9) == "1.2/2.4 GB"
    assert format_bytes(1e5, 968_800) == "100.0/968.8 kB"
    assert format_bytes(5, 999) == "5/999 B"


def test_the_bar_shows_no_estimate_in_its_first_second_then_the_average_rate() -> None:
    out = io.StringIO()
    bar = Bar(total=10, desc="generating", unit="request", file=out, smoothing=0, mininterval=0)
    bar.update(1)
    bar.update(1)
    assert "<" not in str(bar) and "2/10" in str(bar)  # [00:00, ...]: no "elapsed<remaining"
    bar.start_t -= 4.0  # as if the two requests took 4 s: 0.5 requests/s, 8 left
    assert "<00:16" in str(bar)
    bar.close()


def test_progress_on_a_terminal_draws_the_bar_and_logs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with Progress(4, "loading weights", "tensor", total_bytes=4000, tty=True) as p:
        assert isinstance(p.bar, Bar) and p.bar.smoothing == 0
        p.update(4, 4000)
    err = capsys.readouterr().err
    assert "loading weights: 100%" in err and "4/4" in err and "4.0/4.0 kB" in err and "[xrt]" not in err


def test_first_run_says_where_it_wrote_the_tiny_checkpoint_and_logs_weight_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m xrt run` with stderr a pipe, as in CI or a log file: where the checkpoint went, and the loading
    line; a later run that finds the checkpoint says nothing of it."""
    env = {**os.environ, "XRT_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "xrt", "run", "model=qwen3-tiny", "prompt=Hello", "sampling.max_tokens=2"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    loading = r"^\[xrt\] loading weights: (\d+)/\1 tensors, ([\d.]+)/\2 kB in [\d.]+ s$"
    assert re.search(loading, r.stderr, re.M), r.stderr
    assert "\r" not in r.stderr
    (checkpoint,) = [p for p in tmp_path.iterdir() if p.name.startswith("qwen3-tiny-")]
    assert f"[xrt] wrote the tiny Qwen3 checkpoint to {checkpoint}\n" in r.stderr

    from xrt.models.checkpoint import resolve_checkpoint
    from xrt.models.tiny import tiny_model_args

    monkeypatch.setenv("XRT_CACHE_DIR", str(tmp_path))
    capsys.readouterr()
    assert resolve_checkpoint(tiny_model_args()) == str(checkpoint)
    assert capsys.readouterr().err == ""
