"""`xrt serve` through the official openai client against a real server on 127.0.0.1: completions and chat,
streamed and whole, equal to each other and to `xrt.LLM` offline (greedy); usage; include_usage; n; stop strings;
many concurrent streams; a client that leaves frees its pages."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from conftest import tiny_config  # noqa: E402
from serve_helpers import clients, metric, running_server, wait_until  # noqa: E402

from xrt.config import LoadFormat, SamplingArgs  # noqa: E402
from xrt.engine.llm import LLM  # noqa: E402
from xrt.serve.server import BackgroundServer  # noqa: E402

MODEL = "qwen3-tiny"
PROMPTS = ["Hello", "The river", "Once upon a time there was", "a b c d e f g"]
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module", params=[True, False], ids=["engine-process", "engine-thread"])
def server(tiny_checkpoint: str, request: pytest.FixtureRequest) -> Iterator[BackgroundServer]:
    """Every test against both transports (serve.engine_process): they must not differ in anything a client sees."""
    with running_server(tiny_config(tiny_checkpoint), engine_process=request.param) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: str) -> Iterator[LLM]:
    """The same model in the same config, offline: what the server's greedy outputs must equal."""
    with LLM(tiny_config(tiny_checkpoint)) as llm:
        yield llm


@pytest.fixture
def client(server: BackgroundServer) -> Any:
    return clients(server.url)[0]


@pytest.fixture
def aclient(server: BackgroundServer) -> Any:
    return clients(server.url)[1]


def offline(llm: LLM, prompts: list[str], max_tokens: int, **sampling: Any) -> list[str]:
    params = SamplingArgs(max_tokens=max_tokens, ignore_eos=True, **sampling)
    return [o.text for o in llm.generate(prompts, params)]


def streamed_completion(client: Any, **kwargs: Any) -> tuple[dict[int, str], dict[int, str | None], list[Any]]:
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    chunks = list(client.completions.create(model=MODEL, stream=True, **kwargs))
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason is not None:
                reasons[ch.index] = ch.finish_reason
    return texts, reasons, chunks


def test_completions_streamed_equal_whole_equal_offline(client: Any, reference: LLM) -> None:
    want = offline(reference, PROMPTS, 24)
    assert len(set(want)) == len(want) and all(want)  # distinct, non-empty: equality below means something
    whole = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=24, **GREEDY)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert [c.text for c in whole.choices] == want
    assert {c.finish_reason for c in whole.choices} == {"length"}
    for i, prompt in enumerate(PROMPTS):
        texts, reasons, chunks = streamed_completion(client, prompt=prompt, max_tokens=24, **GREEDY)
        assert texts == {0: want[i]} and reasons == {0: "length"}
        assert len(chunks) > 5  # streamed as it was generated, not in one piece


def test_usage_counts_prompt_and_completion_tokens(client: Any, reference: LLM) -> None:
    tok = reference.tokenizer
    out = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=9, **GREEDY)
    n_prompt = len(tok.encode(PROMPTS[2]))
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (n_prompt, 9, n_prompt + 9)
    assert out.usage.prompt_tokens_details.cached_tokens == 0  # shorter than a page: nothing to reuse


def test_a_repeated_long_prompt_reports_cached_tokens(client: Any) -> None:
    prompt = " ".join(f"w{i}" for i in range(80))  # several 16-token pages
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, **GREEDY)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, **GREEDY)
    n = first.usage.prompt_tokens
    assert n > 32 and first.usage.prompt_tokens_details.cached_tokens == 0
    assert 16 <= again.usage.prompt_tokens_details.cached_tokens < n


def test_include_usage_puts_usage_on_the_last_chunk_only(client: Any, reference: LLM) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        len(reference.tokenizer.encode("Hello")), 6)
    plain = list(client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, stream=True, **GREEDY))
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)


def test_n_choices(client: Any, reference: LLM) -> None:
    want = offline(reference, ["The river"], 10)[0]
    out = client.completions.create(model=MODEL, prompt="The river", max_tokens=10, n=2, **GREEDY)
    assert [(c.index, c.text) for c in out.choices] == [(0, want), (1, want)]
    assert out.usage.completion_tokens == 20 and out.usage.prompt_tokens == len(reference.tokenizer.encode("The river"))
    texts, reasons, _ = streamed_completion(client, prompt="The river", max_tokens=10, n=2, **GREEDY)
    assert texts == {0: want, 1: want} and reasons == {0: "length", 1: "length"}
    # Sampled with a seed: choices differ from each other (seed + index) and repeat across calls.
    sampled = [client.completions.create(model=MODEL, prompt="The river", max_tokens=12, n=2, temperature=1.0,
                                         seed=7, extra_body={"ignore_eos": True}) for _ in range(2)]
    a, b = ([c.text for c in s.choices] for s in sampled)
    assert a == b and a[0] != a[1]


def test_stop_strings_cut_streamed_and_whole_alike(client: Any, reference: LLM) -> None:
    full = offline(reference, ["The river"], 30)[0]
    stop = full[10:14]
    cut = full[: full.index(stop)]
    whole = client.completions.create(model=MODEL, prompt="The river", max_tokens=30, stop=stop, **GREEDY)
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (cut, "stop")
    texts, reasons, _ = streamed_completion(client, prompt="The river", max_tokens=30, stop=[stop, "\x00zz"],
                                            **GREEDY)
    assert texts == {0: cut} and reasons == {0: "stop"}
    assert offline(reference, ["The river"], 30, stop=[stop]) == [cut]


def test_every_step_that_gives_a_token_is_a_chunk(client: Any, tiny_checkpoint: str) -> None:
    """Also when its text is held back (a stop string could start there) or there is none (no tokenizer: dummy
    weights), as vLLM streams: a client times tokens by chunks (xrt bench bench.scenario=serve's TTFT and ITL)."""
    _, _, chunks = streamed_completion(client, prompt="Once upon", max_tokens=12, **GREEDY)
    assert len([c for c in chunks if c.choices]) == 12  # one request alone gets one token per step
    cfg = tiny_config(tiny_checkpoint)
    cfg.model.load_format = LoadFormat.DUMMY
    with running_server(cfg) as dummy:
        stream = clients(dummy.url)[0].completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=9, stream=True,
                                                          **GREEDY)
        chunks = [c for c in stream if c.choices]
    assert len(chunks) == 9 and all(c.choices[0].text == "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_streamed_equals_whole_equals_llm_chat(client: Any, reference: LLM) -> None:
    messages = [{"role": "user", "content": "Tell me about rivers"}]
    want = reference.chat(messages, SamplingArgs(max_tokens=20, ignore_eos=True))[0].text
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=20, **GREEDY)
    assert whole.choices[0].message.role == "assistant"
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (want, "length")
    assert whole.usage.completion_tokens == 20
    assert whole.usage.prompt_tokens == len(reference.tokenizer.encode(
        reference.apply_chat_template(messages), add_special_tokens=False))
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 20


def test_models_and_health(client: Any, server: Any) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200


async def _stream(aclient: Any, prompt: str, max_tokens: int) -> tuple[str, str | None]:
    text, reason = "", None
    stream = await aclient.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, stream=True,
                                              **GREEDY)
    async for c in stream:
        text += c.choices[0].text
        reason = c.choices[0].finish_reason or reason
    return text, reason


def test_64_concurrent_streams_all_complete_equal_to_sequential(aclient: Any, reference: LLM) -> None:
    prompts = [f"{PROMPTS[i % 4]} {i}" for i in range(64)]
    lengths = [8 + i % 13 for i in range(64)]
    want = [reference.generate(p, SamplingArgs(max_tokens=n, ignore_eos=True))[0].text
            for p, n in zip(prompts, lengths, strict=True)]

    async def everyone() -> list[tuple[str, str | None]]:
        return await asyncio.gather(*(_stream(aclient, p, n) for p, n in zip(prompts, lengths, strict=True)))

    got = asyncio.run(everyone())
    assert [t for t, _ in got] == want
    assert {r for _, r in got} == {"length"}


def test_a_client_that_disconnects_mid_stream_frees_its_pages(server: Any) -> None:
    body = {"model": MODEL, "prompt": "The river " * 40, "max_tokens": 900, "stream": True, "ignore_eos": True}
    before = metric(server.url, "request_success_total", finished_reason="abort")
    e2e_before = metric(server.url, "e2e_request_latency_seconds_count")
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(8)]
        assert all(not line or line.startswith("data: {") for line in got)
        assert metric(server.url, "kv_cache_usage_perc") > 0 and metric(server.url, "num_requests_running") == 1
    # Leaving the block closed the connection: the server aborts the request and frees its pages.
    wait_until(lambda: metric(server.url, "kv_cache_usage_perc") == 0.0, what="kv_cache_usage_perc back to 0")
    assert metric(server.url, "num_requests_running") == 0
    assert metric(server.url, "request_success_total", finished_reason="abort") == before + 1
    # Its chunks are no longer written, but its end still counts (timed when the engine's abort reached the loop).
    wait_until(lambda: metric(server.url, "e2e_request_latency_seconds_count") == e2e_before + 1, what="its E2E")


def test_a_client_that_gives_up_on_a_whole_response_frees_its_pages(server: Any) -> None:
    body = {"model": MODEL, "prompt": "The river " * 40, "max_tokens": 900, "ignore_eos": True}
    before = metric(server.url, "request_success_total", finished_reason="abort")
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=0.3)
    wait_until(lambda: metric(server.url, "request_success_total", finished_reason="abort") == before + 1,
               what="the abandoned request aborted")
    assert metric(server.url, "kv_cache_usage_perc") == 0.0


def test_metrics_count_tokens_and_latencies(client: Any, server: Any) -> None:
    before = metric(server.url, "generation_tokens_total")
    ttft_before = metric(server.url, "time_to_first_token_seconds_count")
    client.completions.create(model=MODEL, prompt=["Hello", "The river"], max_tokens=5, **GREEDY)
    assert metric(server.url, "generation_tokens_total") == before + 10
    assert metric(server.url, "time_to_first_token_seconds_count") == ttft_before + 2
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("num_requests_waiting", "prompt_tokens_total", "inter_token_latency_seconds_bucket",
                 "e2e_request_latency_seconds_sum", "request_queue_time_seconds_count", "prefix_cache_hits_total",
                 "prefix_cache_queries_total"):
        assert f"xrt:{name}" in text, name
    assert 'request_success_total{finished_reason="length",model_name="qwen3-tiny"}' in text


def test_a_streams_latencies_are_read_as_its_chunks_are_written(server: Any) -> None:
    """TTFT, ITL and E2E of a streamed request, one observation per token: the server's TTFT runs from the request's
    first bytes to its first chunk written, inside what the client waited (from before it sent to after it read),
    and past the engine's part (queue + prefill)."""
    names = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
             "request_queue_time_seconds", "request_prefill_time_seconds")
    before = {n: (metric(server.url, f"{n}_sum"), metric(server.url, f"{n}_count")) for n in names}
    body = {"model": MODEL, "prompt": "The river " * 20, "max_tokens": 6, "ignore_eos": True, "stream": True}
    with httpx.Client() as http:
        start = time.perf_counter()
        with http.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            client_ttft = time.perf_counter() - start
            rest = list(lines)
    assert json.loads(first[6:])["choices"] and rest[-2:] == ["data: [DONE]", ""]
    took = {n: metric(server.url, f"{n}_sum") - before[n][0] for n in names}
    counts = {n: metric(server.url, f"{n}_count") - before[n][1] for n in names}
    assert counts == dict.fromkeys(names, 1) | {"inter_token_latency_seconds": 5}
    ttft = took["time_to_first_token_seconds"]
    assert took["request_queue_time_seconds"] + took["request_prefill_time_seconds"] < ttft < client_ttft
    assert ttft + took["inter_token_latency_seconds"] == pytest.approx(took["e2e_request_latency_seconds"])


def test_a_requests_arrival_is_its_first_bytes(server: Any) -> None:
    """The latencies count from the first bytes of a request (uvicorn's protocol stamps it), not from when its
    headers were complete and the application was called: a client that sends its request line, waits, then the
    rest, sees that wait in the server's E2E."""
    pytest.importorskip("httptools")
    pause_s = 0.5
    e2e_before = metric(server.url, "e2e_request_latency_seconds_sum")
    payload = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 1}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        time.sleep(pause_s)
        sock.sendall(b"Host: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")
    e2e = metric(server.url, "e2e_request_latency_seconds_sum") - e2e_before
    assert e2e >= pause_s


def test_the_engines_part_of_a_requests_latency_fits_inside_what_the_server_saw(server: Any) -> None:
    names = ("time_to_first_token_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
             "request_decode_time_seconds", "request_inference_time_seconds", "e2e_request_latency_seconds")
    before = {n: (metric(server.url, f"{n}_sum"), metric(server.url, f"{n}_count")) for n in names}
    body = {"model": MODEL, "prompt": "The river " * 20, "max_tokens": 30, "ignore_eos": True}
    httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).raise_for_status()
    took = {}
    for n in names:
        total, count = metric(server.url, f"{n}_sum") - before[n][0], metric(server.url, f"{n}_count") - before[n][1]
        assert count == 1, n
        took[n.removeprefix("request_").split("_")[0]] = total
    # arrival -> first step -> first token (engine) -> the event loop has it; the engine's steps inside the e2e
    assert 0 < took["queue"] + took["prefill"] <= took["time"]
    assert took["inference"] == pytest.approx(took["prefill"] + took["decode"], rel=1e-6, abs=1e-9)
    assert took["queue"] + took["inference"] <= took["e2e"]
    assert took["decode"] > 0


def test_the_http_loop_polls_while_requests_live_and_then_sleeps(tiny_checkpoint: str, reference: LLM) -> None:
    """serve.http_spin_ms: the HTTP process's poller runs from a request's submission until spin_ms after the last
    one ends, then stops (no core left busy); answers are unchanged. 0: no poller at all."""
    with running_server(tiny_config(tiny_checkpoint), http_spin_ms=300.0) as s:
        engine = s.state.loop
        out = clients(s.url)[0].completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=8, **GREEDY)
        assert out.choices[0].text == offline(reference, PROMPTS[1:2], 8)[0]
        spinner = engine._spinner
        assert spinner is not None and not spinner.done(), "the poller stopped within its window"
        wait_until(spinner.done, 5.0, "the poller to stop after its window")
        clients(s.url)[0].completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=2, **GREEDY)
        assert engine._spinner is not spinner, "a request after the window starts a new poller"
    with running_server(tiny_config(tiny_checkpoint), http_spin_ms=0.0) as s:
        clients(s.url)[0].completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=2, **GREEDY)
        assert s.state.loop._spinner is None
