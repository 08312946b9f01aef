"""A real server on 127.0.0.1 for the serve tests: the tiny checkpoint's engine (in its own process unless
serve.engine_process=false) behind `BackgroundServer` (uvicorn on a thread, a free port), and readers of its
/metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import httpx

from xrt.config import XrtConfig
from xrt.engine.tokenizer import Tokenizer
from xrt.serve.app import build_state
from xrt.serve.server import BackgroundServer


@contextmanager
def running_server(cfg: XrtConfig, tokenizer: Tokenizer | None = None, **serve: Any) -> Iterator[BackgroundServer]:
    """tokenizer: one injected into the engine (dummy weights have none of their own); serve: ServeArgs fields over
    cfg.serve's."""
    cfg = attrs.evolve(cfg, serve=attrs.evolve(cfg.serve, **serve))
    state = build_state(cfg, tokenizer)
    try:
        server = BackgroundServer(state).start()
    except BaseException:
        state.close()
        raise
    try:
        yield server
    finally:
        server.stop()


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics by its name and labels as written (`xrt:x{model_name="m"}`), bucket lines left out."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line and not line.startswith("#") and "_bucket{" not in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def metric(url: str, name: str, **labels: str) -> float:
    labels = {"model_name": "qwen3-tiny", **labels}
    key = f"xrt:{name}{{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return metrics(url).get(key, 0.0)


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)



def clients(url: str, api_key: str = "unused") -> tuple[Any, Any]:
    """The official openai clients (sync, async) for a server; no retries: a 503 must reach the test."""
    import openai

    base = f"{url}/v1"
    return (openai.OpenAI(base_url=base, api_key=api_key, max_retries=0, timeout=60),
            openai.AsyncOpenAI(base_url=base, api_key=api_key, max_retries=0, timeout=120))
