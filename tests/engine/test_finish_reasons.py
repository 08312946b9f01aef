"""Why a request ended, on the tiny model end to end: "length" only for sampling.max_tokens, "context_length"
when model.max_model_len came first (a larger max_tokens is accepted with one warning per engine), "kv_cache"
when a request alone filled the whole KV cache (others it displaced recover and finish), "stop" for a stop
string. One runner per module; engines that need a fresh state share it."""

from __future__ import annotations

import attrs
import pytest
from conftest import tiny_config

from xrt.config import CacheArgs, XrtConfig
from xrt.engine.llm import LLM

MAX_MODEL_LEN = 64
PAGE = 16  # cache.page_size's default
WARNING = "sampling.max_tokens="


def config(checkpoint: str, num_pages: int = 64) -> XrtConfig:
    cfg = tiny_config(checkpoint, cache=CacheArgs(num_pages=num_pages))
    cfg.model = attrs.evolve(cfg.model, max_model_len=MAX_MODEL_LEN)
    return cfg


@pytest.fixture(scope="module")
def llm(tiny_checkpoint: str) -> LLM:
    return LLM(config(tiny_checkpoint))


def fresh(llm: LLM) -> LLM:
    """A new engine (its own scheduler, KV manager and warning state) on the module's runner."""
    return LLM(llm.cfg, runner=llm.engine.runner)


def run(llm: LLM, prompt: list[int], **sampling: object) -> tuple[str, int]:
    (out,) = llm.generate([prompt], {"ignore_eos": True, **sampling})
    return out.finish_reason, len(out.token_ids)


def test_length_is_max_tokens(llm: LLM) -> None:
    assert run(llm, [1, 2, 3], max_tokens=5) == ("length", 5)


def test_context_length_is_max_model_len(llm: LLM) -> None:
    prompt = list(range(1, 61))
    assert run(llm, prompt, max_tokens=10) == ("context_length", MAX_MODEL_LEN - 60)
    # Exactly the context left: the request got all it asked for, by its own limit.
    assert run(llm, prompt, max_tokens=4) == ("length", 4)
    assert run(llm, prompt, max_tokens=10**30) == ("context_length", 4)


def test_a_max_tokens_beyond_the_context_is_warned_about_once_per_engine(
    llm: LLM, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = fresh(llm)
    capsys.readouterr()
    engine.generate([[5] * 50, [6] * 60], {"max_tokens": 20})  # both past the context left
    engine.generate([[7] * 55], {"max_tokens": 30})
    err = capsys.readouterr().err
    assert err.count(WARNING) == 1
    assert ("[xrt] sampling.max_tokens=20 is more than the 14 tokens model.max_model_len=64 leaves after a 50-token "
            "prompt: generation stops there, with finish_reason 'context_length' (logged once per engine)") in err
    fresh(llm).generate([[5] * 50], {"max_tokens": 20})
    assert capsys.readouterr().err.count(WARNING) == 1  # another engine warns again
    engine.generate([[1, 2]], {"max_tokens": 3})
    assert WARNING not in capsys.readouterr().err


def test_kv_cache_when_a_request_alone_fills_the_whole_cache(llm: LLM) -> None:
    small = LLM(config(llm.engine.runner.checkpoint_dir or "", num_pages=2))
    # 2 pages hold 32 tokens: 22 are generated into them and one more is sampled that has no page.
    assert run(small, list(range(1, 11)), max_tokens=50) == ("kv_cache", 2 * PAGE - 10 + 1)
    # Within the cache, the same request ends by its own limits.
    assert run(small, list(range(1, 11)), max_tokens=5) == ("length", 5)


def test_requests_displaced_by_one_that_fills_the_cache_recover_and_finish(llm: LLM) -> None:
    small = LLM(config(llm.engine.runner.checkpoint_dir or "", num_pages=3))
    first, second = list(range(1, 11)), list(range(20, 32))
    alone = small.generate([second], {"ignore_eos": True, "max_tokens": 8})[0].token_ids
    outs = small.generate([first, second], [{"ignore_eos": True, "max_tokens": 50},
                                            {"ignore_eos": True, "max_tokens": 8}])
    # Each takes a page for its prompt; growing, the first preempts the second, and alone fills all three.
    assert small.engine.num_preemptions >= 1 and outs[1].num_preemptions >= 1
    assert (outs[0].finish_reason, len(outs[0].token_ids)) == ("kv_cache", 3 * PAGE - 10 + 1)
    # The second was recomputed from its prompt and its tokens so far: the same tokens as alone.
    assert (outs[1].finish_reason, outs[1].token_ids) == ("length", alone)
    assert all(o.error is None for o in outs)


def test_stop_is_a_stop_string(llm: LLM) -> None:
    (free,) = llm.generate(["Once upon a time"], {"ignore_eos": True, "max_tokens": 12})
    stop = free.text[4:7]
    assert stop and free.text.find(stop) == 4
    (out,) = llm.generate(["Once upon a time"], {"ignore_eos": True, "max_tokens": 12, "stop": [stop]})
    assert out.finish_reason == "stop" and out.text == free.text[:4]
