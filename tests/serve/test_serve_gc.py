"""serve.freeze_gc: once a server has started, its start-up heap is frozen (gc.freeze) in the HTTP process and in the
engine's, so a full collection while serving walks only what serving made; the HTTP process hands its frozen objects
back to the collector when the server stops; off, nothing is frozen. A frozen server serves as before."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("fastapi")

from conftest import tiny_config  # noqa: E402
from serve_helpers import running_server  # noqa: E402

from xrt.serve.in_process import ProcessEngine  # noqa: E402

# Far fewer than a started server holds (torch alone, imported, tracks ~100k objects), far more than none.
MANY = 10_000


@pytest.fixture(autouse=True)
def nothing_frozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def _completes(url: str) -> None:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("engine_process", [True, False], ids=["engine-process", "engine-thread"])
def test_a_started_server_freezes_its_heap_and_hands_it_back_when_it_stops(tiny_checkpoint: str,
                                                                             engine_process: bool) -> None:
    with running_server(tiny_config(tiny_checkpoint), engine_process=engine_process, freeze_gc=True) as server:
        assert server.state.frozen_objects > MANY
        # Frozen objects freed since (their last reference dropped) leave the count: at most what was frozen.
        assert MANY < gc.get_freeze_count() <= server.state.frozen_objects
        if engine_process:
            assert isinstance(server.state.loop, ProcessEngine)
            assert server.state.loop.frozen_objects > MANY  # the engine's process froze its own
        _completes(server.url)
    assert gc.get_freeze_count() == 0


def test_freeze_gc_off_freezes_nothing(tiny_checkpoint: str) -> None:
    with running_server(tiny_config(tiny_checkpoint), freeze_gc=False) as server:
        assert gc.get_freeze_count() == 0
        assert server.state.frozen_objects == 0
        assert isinstance(server.state.loop, ProcessEngine) and server.state.loop.frozen_objects == 0
        _completes(server.url)
