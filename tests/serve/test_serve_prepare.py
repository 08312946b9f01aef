"""A request body to engine requests (xrt.serve.prepare) without a server: the sampling a body gives is built through
the schema once per distinct set of values and shared after (`SamplingCache`), equal to a fresh build, never
confused with another set; a refused value is refused every time; a token-id prompt is range-checked."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from xrt.config import SamplingArgs, SchedulerArgs  # noqa: E402
from xrt.engine.admission import Admission  # noqa: E402
from xrt.engine.errors import RequestError  # noqa: E402
from xrt.engine.validate_sampling import validate_sampling  # noqa: E402
from xrt.serve.errors import APIError  # noqa: E402
from xrt.serve.prepare import SamplingCache, prepare_completion  # noqa: E402
from xrt.serve.protocol import CompletionRequest  # noqa: E402

ADMISSION = Admission(None, None, 1000, 4096, SchedulerArgs(), 1000, 16)


def test_a_set_of_values_is_built_once_and_equals_a_fresh_build() -> None:
    defaults = SamplingArgs(max_tokens=7, top_k=5)
    cache = SamplingCache(defaults)
    given = {"temperature": 0.5, "stop": ["x", "y"], "logprobs": None}
    first = cache(dict(given))
    assert first == validate_sampling(given, defaults) and first.max_tokens == 7 and first.top_k == 5
    assert cache(dict(given)) is first
    assert cache({**given, "stop": ["x"]}).stop == ["x"]  # another set: another build
    assert cache({**given, "temperature": 0.7}).temperature == 0.7
    assert cache({"ignore_eos": True, "logprobs": None}).ignore_eos is True
    assert cache({"ignore_eos": False, "logprobs": None}).ignore_eos is False


def test_a_refused_value_is_refused_every_time() -> None:
    cache = SamplingCache(SamplingArgs())
    for _ in range(2):
        with pytest.raises(RequestError, match="top_p"):
            cache({"top_p": 0.0, "logprobs": None})


def test_bodies_with_other_sampling_get_their_own() -> None:
    cache = SamplingCache(SamplingArgs())
    a = prepare_completion(CompletionRequest(prompt=[1, 2, 3], max_tokens=4, temperature=0.0), ADMISSION, cache)
    b = prepare_completion(CompletionRequest(prompt=[1, 2, 3], max_tokens=9, temperature=0.0), ADMISSION, cache)
    c = prepare_completion(CompletionRequest(prompt=[4], max_tokens=4, temperature=0.0), ADMISSION, cache)
    assert [r.sampling.max_tokens for r in (a.requests[0], b.requests[0], c.requests[0])] == [4, 9, 4]
    assert c.requests[0].sampling is a.requests[0].sampling
    with pytest.raises(APIError, match=r"max_tokens: must be >= 1"):
        prepare_completion(CompletionRequest(prompt=[1], max_tokens=0), ADMISSION, cache)


@pytest.mark.parametrize("prompt", [[1, 1000], [-1, 2], [[3], [5, 1000]]])
def test_token_ids_out_of_range_are_refused(prompt: list) -> None:
    with pytest.raises(APIError, match=r"token ids must be integers in \[0, 1000\)"):
        prepare_completion(CompletionRequest(prompt=prompt), ADMISSION, SamplingCache(SamplingArgs()))
