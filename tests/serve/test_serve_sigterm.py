"""`python -m xrt serve` as a process: SIGTERM stops accepting at once, lets the request in flight finish within
serve.grace_period_s (or cancels it when the grace period ends first), and exits 0; a problem before serving is
one `error:` line and exit 2."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def serve_process(cache_dir: str, *overrides: str) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """The process, its URL (from its start-up line) and its stderr lines so far (a thread keeps reading)."""
    env = {**os.environ, "XRT_CACHE_DIR": cache_dir, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "xrt", "serve", "serve.port=0", "device=cpu", *overrides],
                            cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    seen: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            seen.put(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None:
            line = seen.get(timeout=max(deadline - time.monotonic(), 0.1))
            if " on http://" in line:
                url = line.split(" on ", 1)[1].split()[0]
        yield proc, url, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stream_body(max_tokens: int) -> dict[str, object]:
    return {"prompt": "The river", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def test_sigterm_finishes_the_request_in_flight_and_exits_0(xrt_cache_dir: str, tiny_checkpoint: str) -> None:
    with serve_process(xrt_cache_dir, "serve.grace_period_s=30") as (proc, url, lines):
        with httpx.stream("POST", f"{url}/v1/completions", json=stream_body(150), timeout=60) as r:
            events = r.iter_lines()
            first = next(events)
            assert first.startswith("data: {")
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(httpx.ConnectError):  # not accepting any more
                httpx.get(f"{url}/health", timeout=5)
            rest = [e for e in events if e.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        usage = json.loads(rest[-2][len("data: "):])["usage"]
        assert usage["completion_tokens"] == 150  # finished, not cut
        assert proc.wait(timeout=30) == 0
    assert any("draining" in line for line in lines)
    assert not any("Traceback" in line for line in lines)


def test_sigterm_cancels_what_the_grace_period_does_not_cover_and_exits_0(xrt_cache_dir: str,
                                                                          tiny_checkpoint: str) -> None:
    with serve_process(xrt_cache_dir, "serve.grace_period_s=0.5") as (proc, url, lines):
        with httpx.stream("POST", f"{url}/v1/completions", json=stream_body(1000), timeout=60) as r:
            events = r.iter_lines()
            next(events)
            proc.send_signal(signal.SIGTERM)
            got = [e for e in events if e.startswith("data: ")]
        assert proc.wait(timeout=30) == 0
        # Cut, not finished (1000 tokens take longer than the grace period), but ended well-formed.
        assert got[-1] == "data: [DONE]"
        assert json.loads(got[-3][len("data: "):])["choices"][0]["finish_reason"] == "abort"
        assert json.loads(got[-2][len("data: "):])["usage"]["completion_tokens"] < 1000
    assert not any("Traceback" in line for line in lines)


@pytest.mark.parametrize("override,text", [
    ("serve.port=99999", "error: serve.port: must be in [0, 65535], got 99999"),
    ("serve.port=http", "error: serve.port: must be an integer, got 'http'"),
    ("serve.max_queued=-1", "error: serve.max_queued: must be >= 0, got -1"),
    ("serve.port=TAKEN", "error: serve.host / serve.port: cannot listen on 127.0.0.1:TAKEN: "),  # before the model
])
def test_start_up_problems_are_one_error_line(xrt_cache_dir: str, override: str, text: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        env = {**os.environ, "XRT_CACHE_DIR": xrt_cache_dir, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        env.pop("XRT_DEBUG", None)
        r = subprocess.run([sys.executable, "-m", "xrt", "serve", "serve.host=127.0.0.1", "device=cpu",
                            override.replace("TAKEN", port)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(text.replace("TAKEN", port))
