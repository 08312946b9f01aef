"""logprobs through the official openai client: /v1/completions `logprobs=k` and /v1/chat/completions `logprobs` +
`top_logprobs`, whole and streamed, against the engine offline (`xrt.LLM` with sampling.logprobs, itself checked
against transformers in tests/engine/test_logprobs.py) and the tokenizer's text and bytes of each token; streamed
chunks concatenated equal the whole answer; out-of-range values are 400s naming the field and the bound."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from conftest import tiny_config  # noqa: E402
from serve_helpers import clients, running_server  # noqa: E402

from xrt.config import SamplingArgs  # noqa: E402
from xrt.engine.llm import LLM  # noqa: E402
from xrt.engine.outputs import RequestOutput  # noqa: E402
from xrt.serve.server import BackgroundServer  # noqa: E402

MODEL = "qwen3-tiny"
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
TOL = 1e-4


@pytest.fixture(scope="module")
def server(tiny_checkpoint_diverse: str) -> Iterator[BackgroundServer]:
    # The diverse weights: greedy continuations vary, so the top tokens differ from step to step.
    with running_server(tiny_config(tiny_checkpoint_diverse)) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_checkpoint_diverse: str) -> Iterator[LLM]:
    with LLM(tiny_config(tiny_checkpoint_diverse)) as llm:
        yield llm


@pytest.fixture
def client(server: BackgroundServer) -> Any:
    return clients(server.url)[0]


def offline(llm: LLM, prompt: str, k: int, max_tokens: int, chat: bool = False) -> RequestOutput:
    sampling = SamplingArgs(max_tokens=max_tokens, ignore_eos=True, logprobs=k)
    if chat:
        return llm.chat([{"role": "user", "content": prompt}], sampling)[0]
    return llm.generate([prompt], sampling)[0]


def test_completions_logprobs_whole_and_streamed(client: Any, reference: LLM) -> None:
    want = offline(reference, "The river", 3, 10)
    tok = reference.tokenizer
    assert want.logprobs is not None and tok is not None
    whole = client.completions.create(model=MODEL, prompt="The river", max_tokens=10, logprobs=3, **GREEDY)
    choice = whole.choices[0]
    lp = choice.logprobs
    texts = [tok.token_text(t) for t in want.token_ids]
    assert lp.tokens == texts
    assert lp.token_logprobs == pytest.approx([x.logprob for x in want.logprobs], abs=TOL)
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    assert lp.text_offset == offsets
    for top, ref, text in zip(lp.top_logprobs, want.logprobs, texts, strict=True):
        # The top 3 and the sampled token (greedy: one of them, the largest): OpenAI's "up to logprobs + 1".
        named = {tok.token_text(t): v for t, v in ref.top}
        assert set(top) == set(named) | {text} and len(top) in (3, 4)
        assert top == pytest.approx(named | {text: ref.logprob}, abs=TOL)
        assert max(top.values()) == pytest.approx(top[text])
    assert len({frozenset(t) for t in lp.top_logprobs}) > 1  # the alternatives change along the text

    chunks = list(client.completions.create(model=MODEL, prompt="The river", max_tokens=10, logprobs=3,
                                            stream=True, **GREEDY))
    assert len(chunks) > 3
    joined: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        got = c.choices[0].logprobs
        assert got is not None and len(got.tokens) > 0  # every chunk carries its tokens' logprobs
        for key, values in joined.items():
            values += getattr(got, key)
    assert joined["tokens"] == lp.tokens and joined["text_offset"] == lp.text_offset
    assert joined["token_logprobs"] == pytest.approx(lp.token_logprobs, abs=TOL)
    assert [set(t) for t in joined["top_logprobs"]] == [set(t) for t in lp.top_logprobs]
    assert "".join(c.choices[0].text for c in chunks) == choice.text


def test_logprobs_zero_and_none(client: Any) -> None:
    zero = client.completions.create(model=MODEL, prompt="The river", max_tokens=4, logprobs=0, **GREEDY)
    lp = zero.choices[0].logprobs
    assert [list(t) for t in lp.top_logprobs] == [[t] for t in lp.tokens]  # the sampled token alone
    none = client.completions.create(model=MODEL, prompt="The river", max_tokens=4, **GREEDY)
    assert none.choices[0].logprobs is None
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          **GREEDY)
    assert chat.choices[0].logprobs is None


def test_chat_logprobs_whole_and_streamed(client: Any, reference: LLM) -> None:
    prompt = "Tell me about rivers"
    want = offline(reference, prompt, 2, 12, chat=True)
    tok = reference.tokenizer
    assert want.logprobs is not None and tok is not None
    messages = [{"role": "user", "content": prompt}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=12, logprobs=True,
                                           top_logprobs=2, **GREEDY)
    content = whole.choices[0].logprobs.content
    assert len(content) == len(want.token_ids) == whole.usage.completion_tokens
    for entry, token, ref in zip(content, want.token_ids, want.logprobs, strict=True):
        assert (entry.token, entry.bytes) == (tok.token_text(token), list(tok.token_bytes(token)))
        assert entry.logprob == pytest.approx(ref.logprob, abs=TOL)
        assert [t.token for t in entry.top_logprobs] == [tok.token_text(t) for t, _ in ref.top]
        assert [t.bytes for t in entry.top_logprobs] == [list(tok.token_bytes(t)) for t, _ in ref.top]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([v for _, v in ref.top], abs=TOL)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the most likely

    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=12,
                                                 logprobs=True, top_logprobs=2, stream=True, **GREEDY))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in streamed] == [
        (e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=TOL)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


@pytest.mark.parametrize(("chat", "kwargs", "param", "words"), [
    (False, {"logprobs": 21}, "logprobs", "logprobs: must be in [0, 20], got 21"),
    (False, {"logprobs": -1}, "logprobs", "logprobs: must be in [0, 20], got -1"),
    (True, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs: must be in [0, 20], got 21"),
    (True, {"top_logprobs": 2}, "top_logprobs", "top_logprobs: needs logprobs=true"),
])
def test_out_of_range_logprobs_are_400(client: Any, chat: bool, kwargs: dict[str, Any], param: str,
                                       words: str) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        if chat:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], **kwargs)
        else:
            client.completions.create(model=MODEL, prompt="hi", **kwargs)
    assert bad.value.status_code == 400 and bad.value.param == param
    assert bad.value.body["message"] == words and bad.value.body["type"] == "invalid_request_error"
