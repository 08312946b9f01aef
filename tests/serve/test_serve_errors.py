"""Bad requests get the OpenAI error JSON and leave nothing held: 400 (malformed JSON, wrong types, bad sampling,
a prompt too long, with both numbers), 404 (unknown model or route), 401 (no or wrong key, when one is set),
503 beyond the queue bound; an engine that fails (an error in a step, its process killed) ends its requests with an
error and /health says so."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import attrs
import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from conftest import tiny_config  # noqa: E402
from serve_helpers import clients, metric, running_server, wait_until  # noqa: E402

from xrt.config import SamplingArgs, SchedulerArgs  # noqa: E402
from xrt.serve.server import BackgroundServer  # noqa: E402

MODEL = "qwen3-tiny"


@pytest.fixture(scope="module")
def server(tiny_checkpoint: str) -> Iterator[BackgroundServer]:
    with running_server(tiny_config(tiny_checkpoint)) as s:
        yield s


def post(server: BackgroundServer, body: Any, path: str = "/v1/completions", **kw: Any) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else None
    return httpx.post(f"{server.url}{path}", content=content, json=None if content is not None else body,
                      timeout=30, **kw)


def check_error(r: httpx.Response, status: int, *words: str, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "\n" not in error["message"]
    for w in words:
        assert w in error["message"], (w, error["message"])
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize(("body", "words", "param"), [
    ("{not json", ["not valid JSON"], None),
    ("[1, 2]", ["must be a JSON object"], None),
    ({"model": MODEL, "prompt": "hi", "top_p": 0}, ["top_p: must be in (0.0, 1.0], got 0"], "top_p"),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, ["temperature: must be >= 0, got -1"], "temperature"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, ["max_tokens: must be >= 1, got 0"], "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": "lots"}, ["max_tokens"], "max_tokens"),
    ({"model": MODEL, "prompt": {"a": 1}}, ["prompt: got {\"a\": 1}, expected one of str"], "prompt"),
    ({"model": MODEL}, ["prompt: Field required"], "prompt"),
    ({"model": MODEL, "prompt": [5, 99999]}, ["token ids must be integers in [0, 2048), got 99999"], "prompt"),
    ({"model": MODEL, "prompt": list(range(1, 1501))},
     ["prompt has 1500 tokens; model.max_model_len=1024", "at most 1023 prompt tokens"], "prompt"),
    ({"model": MODEL, "prompt": "hi", "n": 0}, ["n: Input should be greater than or equal to 1"], "n"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 21}, ["logprobs: must be in [0, 20], got 21"], "logprobs"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 1.5}, ["logprobs"], "logprobs"),
    ({"model": MODEL, "prompt": "hi", "stop": [1, 2]}, ["stop"], "stop"),
])
def test_bad_completions_get_400_in_the_openai_shape(server: BackgroundServer, body: Any, words: list[str],
                                                      param: str | None) -> None:
    error = check_error(post(server, body), 400, *words, param=param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("body", "words"), [
    ({"model": MODEL, "messages": []}, ["messages"]),
    ({"model": MODEL, "messages": [{"content": "no role"}]}, ["messages.0.role: Field required"]),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     ["only text parts are supported"]),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
      "max_completion_tokens": 2}, ["not both"]),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x " * 1500}]}, ["model.max_model_len=1024"]),
])
def test_bad_chat_requests_get_400(server: BackgroundServer, body: Any, words: list[str]) -> None:
    check_error(post(server, body, "/v1/chat/completions"), 400, *words)


def test_the_official_client_raises_its_own_errors(server: BackgroundServer) -> None:
    client = clients(server.url)[0]
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt="hi", top_p=0)
    assert bad.value.status_code == 400 and bad.value.param == "top_p"
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="hi")
    assert missing.value.code == "model_not_found" and "gpt-4" in missing.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_unknown_routes_get_404_in_the_openai_shape(server: BackgroundServer) -> None:
    check_error(httpx.get(f"{server.url}/v1/nothing"), 404, "/v1/nothing")
    check_error(httpx.get(f"{server.url}/v1/completions"), 405)


def test_nothing_bad_leaves_pages_held_and_the_server_still_serves(server: BackgroundServer) -> None:
    for body in ("{", {"prompt": list(range(1, 1501))}, {"prompt": "hi", "top_k": -5}):
        assert post(server, body).status_code == 400
    assert metric(server.url, "kv_cache_usage_perc") == 0.0 and metric(server.url, "num_requests_waiting") == 0
    out = clients(server.url)[0].completions.create(model=MODEL, prompt="hi", max_tokens=3)
    assert out.usage.completion_tokens >= 1
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_a_wrong_or_missing_key_gets_401(tiny_checkpoint: str) -> None:
    with running_server(tiny_config(tiny_checkpoint), api_key="sekrit") as server:
        with pytest.raises(openai.AuthenticationError) as wrong:
            clients(server.url, api_key="guess")[0].completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert wrong.value.status_code == 401
        check_error(post(server, {"model": MODEL, "prompt": "hi"}), 401, "Authorization: Bearer")
        check_error(httpx.get(f"{server.url}/v1/models"), 401)
        out = clients(server.url, api_key="sekrit")[0].completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert out.usage.completion_tokens == 2 or out.choices[0].finish_reason == "stop"
        assert httpx.get(f"{server.url}/health").status_code == 200  # open: a load balancer's probe has no key
        assert httpx.get(f"{server.url}/metrics").status_code == 200


def test_requests_beyond_the_queue_bound_get_503(tiny_checkpoint: str) -> None:
    # One running at a time and one waiting: the third request (or choice) is refused.
    cfg = tiny_config(tiny_checkpoint, scheduler=SchedulerArgs(max_num_seqs=1))
    with running_server(cfg, max_queued=1) as server:
        client = clients(server.url)[0]
        with pytest.raises(openai.InternalServerError) as full:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2, n=3)
        assert full.value.status_code == 503 and "limit is 2" in full.value.message
        long = {"model": MODEL, "prompt": "The river", "max_tokens": 900, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=long, timeout=30) as a, \
                httpx.stream("POST", f"{server.url}/v1/completions", json=long, timeout=30) as b:
            lines_a = a.iter_lines()  # kept: a dropped line iterator closes the connection (httpcore)
            next(lines_a)
            wait_until(lambda: metric(server.url, "num_requests_waiting") == 1, what="the second request queued")
            error = check_error(post(server, {"model": MODEL, "prompt": "hi"}), 503, "retry later")
            assert error["code"] == "queue_full" and b.status_code == 200
        # Both streams closed: their requests aborted, room again.
        wait_until(lambda: metric(server.url, "kv_cache_usage_perc") == 0.0, what="pages freed")
        out = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, n=2)
        assert len(out.choices) == 2


def test_an_engine_error_fails_its_requests_with_500_and_health_says_so(tiny_checkpoint: str) -> None:
    # On a thread, so the test can break the engine it holds (the process case is the next test).
    with running_server(tiny_config(tiny_checkpoint), engine_process=False) as server:
        def broken() -> list[Any]:
            raise RuntimeError("device lost")

        server.state.loop.engine.step_stream = broken  # type: ignore[attr-defined]
        check_error(post(server, {"model": MODEL, "prompt": "hi"}), 500, "device lost")
        check_error(httpx.get(f"{server.url}/health"), 503, "device lost")
        check_error(post(server, {"model": MODEL, "prompt": "hi"}), 503, "the engine stopped on an error")


def test_an_engine_process_that_dies_fails_its_streams_and_health_says_so(tiny_checkpoint: str) -> None:
    cfg = tiny_config(tiny_checkpoint)
    with running_server(cfg) as server:
        proc = server.state.loop.proc  # type: ignore[attr-defined]
        assert proc.is_alive() and proc.pid != os.getpid()
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")  # the first token came: the request is in the engine
            os.kill(proc.pid, signal.SIGKILL)
            rest = "\n".join(lines)
        assert "engine error: the engine process exited (exit code -9)" in rest
        check_error(httpx.get(f"{server.url}/health"), 503, "exit code -9")
        check_error(post(server, {"model": MODEL, "prompt": "hi"}), 503, "the engine stopped on an error")


def test_an_engine_process_whose_http_side_has_gone_ends_its_requests_and_exits(tiny_checkpoint: str) -> None:
    """The HTTP process killed with requests in the engine: the engine's process sees its pipe close, aborts them and
    exits by itself (exit code 0), holding no GPU or port."""
    from xrt.serve.in_process import start_process
    from xrt.serve.metrics import Metrics
    from xrt.serve.wire import frame

    engine = start_process(tiny_config(tiny_checkpoint), None, Metrics(MODEL), 8)
    try:
        request = engine.admission.check("The river " * 50, attrs.evolve(SamplingArgs(), max_tokens=5000,
                                                                         ignore_eos=True))
        engine.sock.sendall(frame(("add", 0, request)) + frame(("add", 1, request)))
        engine.sock.close()  # no stop: the pipe just closes, as when the HTTP process dies
        engine.proc.join(60)
        assert engine.proc.exitcode == 0
    finally:
        if engine.proc.is_alive():
            engine.proc.kill()


KEYS = ["prompt", "n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
        "ignore_eos", "logprobs", "top_logprobs", "model", "echo", "suffix", "presence_penalty"]


def test_whatever_a_client_sends_gets_an_answer_and_leaves_nothing_held(server: BackgroundServer) -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    value = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(2**63, 2**65),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
                      st.lists(st.integers(-2, 3000), max_size=3), st.lists(st.text(max_size=2), max_size=2),
                      st.dictionaries(st.sampled_from(["include_usage", "x"]), st.booleans(), max_size=2))
    bodies = st.dictionaries(st.sampled_from(KEYS), value, max_size=8)

    @hypothesis.settings(max_examples=30, deadline=None, database=None)
    @hypothesis.given(body=bodies, chat=st.booleans())
    def one(body: dict[str, Any], chat: bool) -> None:
        if isinstance(body.get("max_tokens"), (int, float)) and not isinstance(body["max_tokens"], bool):
            body["max_tokens"] = 3  # junk types stay; a number past a few tokens only makes the test slow
        if chat:
            body["messages"] = [{"role": "user", "content": body.pop("prompt", "hi")}]
        r = post(server, json.dumps(body), "/v1/chat/completions" if chat else "/v1/completions")
        assert r.status_code in (200, 400, 404), r.text
        if r.status_code != 200:
            check_error(r, r.status_code)

    one()
    wait_until(lambda: metric(server.url, "kv_cache_usage_perc") == 0.0, what="no page held")
    assert httpx.get(f"{server.url}/health").status_code == 200
