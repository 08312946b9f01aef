"""The streaming engine API: `LLMEngine.step_stream` hands out each streamed request's new tokens and text after
every step (stop strings held back across chunk edges), and `abort` ends a request wherever it is, freeing its
pages, also with overlapped decode steps in flight. Against the fake runners, so every scheduling path runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_engine_overlap import AsyncFakeRunner, CharTokenizer, prompts

from xrt.config import SamplingArgs
from xrt.engine.engine import LLMEngine
from xrt.engine.llm import LLM
from xrt.engine.outputs import RequestOutput, StreamOutput
from xrt.engine.stop import stop_holdback


def drain(engine: LLMEngine, on_step: Callable[[int], None] | None = None) -> dict[int, list[StreamOutput]]:
    """Every StreamOutput by request id, stepping until nothing is left; on_step(step number) between steps."""
    got: dict[int, list[StreamOutput]] = {}
    n = 0
    while engine.has_unfinished():
        if on_step is not None:
            on_step(n)
        for d in engine.step_stream():
            got.setdefault(d.request_id, []).append(d)
        n += 1
    return got


def queue_all(engine: LLMEngine, ps: list[list[int]], sampling: list[SamplingArgs], stream: bool = True) -> list[int]:
    return [engine.queue(engine.check_request(p, s), stream=stream) for p, s in zip(ps, sampling, strict=True)]


def check_stream(deltas: list[StreamOutput], want: RequestOutput) -> None:
    """The deltas add up to the final output, which equals `want`'s; only the last carries it."""
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    final = deltas[-1].output
    assert final is not None
    assert (final.token_ids, final.text, final.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    assert [t for d in deltas for t in d.token_ids] == final.token_ids
    assert "".join(d.text for d in deltas) == final.text


def runners(fake_runner: Callable, kind: str, **args: Any) -> Any:
    return fake_runner(**args) if kind == "sync" else AsyncFakeRunner(fake_runner(**args), 64)


@pytest.mark.parametrize("kind", ["sync", "overlapped"])
@pytest.mark.parametrize(("budget", "num_pages"), [(64, 128), (8, 128), (64, 14)])
def test_streamed_equals_batch_output_under_every_scheduling(
    fake_runner: Callable, fake_cfg: Callable, kind: str, budget: int, num_pages: int
) -> None:
    cfg = fake_cfg(num_pages=num_pages, max_batched_tokens=budget)
    ref = fake_runner(num_pages=num_pages, page_size=4)
    ps = prompts(3)
    tok = CharTokenizer()
    texts = [tok.decode(ref.reference_greedy(p, 20)) for p in ps]
    # Stop strings that do occur (so they cut the text mid-stream), one that never does, some requests without.
    sampling = [SamplingArgs(max_tokens=20, ignore_eos=True, stop=[t[5:8]] if i % 3 == 0 else
                             [t[9:11], "\x7f\x7f\x7f"] if i % 3 == 1 else [])
                for i, t in enumerate(texts)]
    want = LLM(cfg, runner=fake_runner(num_pages=num_pages, page_size=4), tokenizer=tok).generate(ps, sampling)
    engine = LLMEngine(cfg, runner=runners(fake_runner, kind, num_pages=num_pages, page_size=4), tokenizer=tok)
    ids = queue_all(engine, ps, sampling)
    got = drain(engine)
    for i, w in zip(ids, want, strict=True):
        check_stream(got[i], w)
        if w.finish_reason == "stop":
            assert len(w.text) < 20 and w.text == texts[ids.index(i)][: len(w.text)]
    assert any(w.finish_reason == "stop" for w in want) and any(w.finish_reason == "length" for w in want)
    assert any(len(d) > 3 for d in got.values())  # it did stream, not one output at the end
    assert engine.kv_cache_usage == 0.0


def test_a_stop_string_split_across_steps_is_never_shown(fake_runner: Callable, fake_cfg: Callable) -> None:
    ref = fake_runner()
    tok = CharTokenizer()
    p = prompts(5)[0]
    text = tok.decode(ref.reference_greedy(p, 20))
    stop = text[6:10]  # four tokens: its first characters arrive in steps before it is complete
    engine = LLMEngine(fake_cfg(), runner=fake_runner(), tokenizer=tok)
    (rid,) = queue_all(engine, [p], [SamplingArgs(max_tokens=20, ignore_eos=True, stop=[stop])])
    deltas = drain(engine)[rid]
    shown = ""
    for d in deltas:
        shown += d.text
        assert text[:6].startswith(shown)  # never past the cut: held back while it could be the stop string
    assert shown == text[:6] == deltas[-1].output.text and deltas[-1].output.finish_reason == "stop"
    assert len(deltas) == 10  # one per token: the tokens were streamed even while their text was held


def test_stop_holdback() -> None:
    assert stop_holdback("hello wor", ["world"]) == 3
    assert stop_holdback("hello", ["world"]) == 0
    assert stop_holdback("abab", ["abc", "bx"]) == 2
    assert stop_holdback("a", ["a"]) == 0  # a whole stop string is the stop check's, not held back


def test_requests_not_streamed_come_out_once_with_everything(fake_runner: Callable, fake_cfg: Callable) -> None:
    engine = LLMEngine(fake_cfg(), runner=fake_runner(), tokenizer=CharTokenizer())
    ids = queue_all(engine, prompts(1, n=3), [SamplingArgs(max_tokens=7, ignore_eos=True)] * 3, stream=False)
    got = drain(engine)
    for i in ids:
        (d,) = got[i]
        check_stream([d], d.output)
        assert len(d.token_ids) == 7 and d.scheduled_at is not None


@pytest.mark.parametrize("kind", ["sync", "overlapped"])
@pytest.mark.parametrize("when", ["queued", "prefilling", "decoding"])
def test_abort_frees_the_request_wherever_it_is(fake_runner: Callable, fake_cfg: Callable, kind: str,
                                                when: str) -> None:
    # A budget of 8 tokens: the 30-token prompt prefills over 4 steps; max_num_seqs=2 keeps the third queued.
    cfg = fake_cfg(max_batched_tokens=8, max_num_seqs=2)
    engine = LLMEngine(cfg, runner=runners(fake_runner, kind), tokenizer=CharTokenizer())
    ps = [list(range(1, 5)), list(range(30)), list(range(40, 44))]
    ids = queue_all(engine, ps, [SamplingArgs(max_tokens=40, ignore_eos=True)] * 3)
    victim = {"queued": ids[2], "prefilling": ids[1], "decoding": ids[0]}[when]
    # Step 0 prefills 4 + 4 tokens, steps 1-4 the rest of the 30-token prompt, then both decode.
    at = 2 if when == "prefilling" else 6
    state: dict[str, Any] = {}

    def on_step(n: int) -> None:
        if n == at:
            if kind == "overlapped" and when == "decoding":
                assert engine._inflight, "a decode launch is in flight while it is aborted"
            seq = engine._live[victim]
            state["status"] = (seq.status.value, seq.in_prefill)
            assert engine.abort(victim)
            assert not engine.abort(victim)  # once

    got = drain(engine, on_step)
    assert state["status"] == {"queued": ("waiting", False), "prefilling": ("running", True),
                               "decoding": ("running", False)}[when]
    out = got[victim][-1].output
    assert out is not None and out.finish_reason == "abort" and len(out.token_ids) < 40
    for i in ids:
        if i != victim:
            assert got[i][-1].output.finish_reason == "length" and len(got[i][-1].output.token_ids) == 40
    assert engine.kv_cache_usage == 0.0 and engine.scheduler.kv.num_free_pages == engine.scheduler.kv.num_pages
    assert not engine.abort(ids[0])  # finished already
    assert not engine.abort(12345)


def test_abort_while_prefilling_frees_its_pages(fake_runner: Callable, fake_cfg: Callable) -> None:
    engine = LLMEngine(fake_cfg(max_batched_tokens=8), runner=fake_runner(), tokenizer=CharTokenizer())
    (rid,) = queue_all(engine, [list(range(60))], [SamplingArgs(max_tokens=5, ignore_eos=True)])
    assert engine.step_stream() == []  # 8 of 60 prompt tokens
    seq = engine._live[rid]
    assert seq.in_prefill and engine.kv_cache_usage > 0
    assert engine.abort(rid)
    assert engine.kv_cache_usage == 0.0
    (d,) = engine.step_stream()
    assert d.output is not None and d.output.finish_reason == "abort" and d.output.token_ids == []
    assert not engine.has_unfinished()
