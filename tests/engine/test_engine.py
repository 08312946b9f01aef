"""The engine end to end against a fake runner whose logits are a function of the context it reads
back through the page tables (tests/conftest.py), so paging mistakes change the tokens."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from xrt.config import CacheArgs, Device, LoadFormat, SamplingArgs, XrtConfig
from xrt.engine.detokenizer import IncrementalDetokenizer
from xrt.engine.engine import LLMEngine
from xrt.engine.llm import LLM
from xrt.engine.sequence import Sequence
from xrt.executor.interface import Runner
from xrt.executor.runner import ModelRunner
from xrt.kvcache.interface import KVSeq
from xrt.models.tiny import tiny_model_args

GREEDY = SamplingArgs(max_tokens=12, ignore_eos=True)


class CharTokenizer:
    """id i <-> chr(32 + i): enough to test text, stop strings and eos without a real tokenizer."""

    def __init__(self, eos_token_ids: list[int] | None = None) -> None:
        self.eos_token_ids = eos_token_ids or []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) - 32 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + i) for i in ids if not (skip_special_tokens and i in self.eos_token_ids))

    def detokenizer(self, num_prompt_tokens: int) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.decode, num_prompt_tokens)


def mixed_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(97) for _ in range(21)]
    fresh = [[rng.randrange(97) for _ in range(n)] for n in (1, 6, 33, 2, 17)]
    return fresh[:2] + [shared + [5, 6, 7], shared[:16] + [1]] + fresh[2:] + [shared + [9], list(shared)]


@pytest.mark.parametrize(
    ("prefix_caching", "chunked", "budget", "num_pages"),
    [
        (True, True, 64, 128),
        (False, True, 64, 128),
        (True, False, 64, 128),
        (False, False, 64, 128),
        (True, True, 8, 128),  # small budget: long prompts prefill over several steps
        (True, True, 64, 14),  # tiny cache: preemption
        (False, False, 64, 14),
    ],
)
def test_greedy_matches_reference_under_every_scheduling(
    fake_runner: Callable, fake_cfg: Callable, prefix_caching: bool, chunked: bool, budget: int, num_pages: int
) -> None:
    runner = fake_runner(num_pages=num_pages, page_size=4)
    cfg = fake_cfg(num_pages=num_pages, max_batched_tokens=budget, chunked_prefill=chunked,
                   prefix_caching=prefix_caching)
    llm = LLM(cfg, runner=runner)
    prompts = mixed_prompts()
    outs = llm.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.error is None and out.finish_reason == "length"
        assert out.token_ids == runner.reference_greedy(prompt, 12)
    if budget < 64:
        assert all(s.num_tokens <= budget for s in runner.steps if s.is_prefill)
    if num_pages < 20:
        assert llm.engine.num_preemptions > 0
    if prefix_caching and num_pages >= 20:
        assert any(o.num_cached_tokens > 0 for o in outs)
    if not prefix_caching:
        assert all(o.num_cached_tokens == 0 for o in outs)


def test_prefix_hits_across_generate_calls(fake_runner: Callable, fake_cfg: Callable) -> None:
    runner = fake_runner()
    llm = LLM(fake_cfg(), runner=runner)
    prompt = list(range(30))
    first = llm.generate([prompt], GREEDY)[0]
    again = llm.generate([prompt + [3]], GREEDY)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 28
    assert again.token_ids == runner.reference_greedy(prompt + [3], 12)


def test_a_prompt_that_can_never_run_is_refused_before_any_is_queued(fake_runner: Callable,
                                                                      fake_cfg: Callable) -> None:
    runner = fake_runner(max_model_len=40)
    llm = LLM(fake_cfg(), runner=runner)
    for bad, message in [
        (list(range(40)), "prompts[1]: prompt has 40 tokens; model.max_model_len=40"),
        ([], "prompts[1]: prompt is empty"),
        ([4, 5, 200], "prompts[1]: token ids must be integers in [0, 97), got 200 at position 2"),
    ]:
        with pytest.raises(ValueError) as e:
            llm.generate([[1, 2, 3], bad], GREEDY)
        assert str(e.value).startswith(message) and not llm.engine.has_unfinished()
    (out,) = llm.generate([[1, 2, 3]], GREEDY)
    assert out.error is None and out.token_ids == runner.reference_greedy([1, 2, 3], 12)


def test_max_model_len_caps_generation(fake_runner: Callable, fake_cfg: Callable) -> None:
    runner = fake_runner(max_model_len=20)
    out = LLM(fake_cfg(), runner=runner).generate([list(range(15))], SamplingArgs(max_tokens=50, ignore_eos=True))[0]
    assert out.finish_reason == "context_length" and len(out.token_ids) == 5


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"top_p": 0.0}, "sampling.top_p: must be in (0.0, 1.0], got 0"),
        ({"temperature": -1.0}, "sampling.temperature: must be >= 0, got -1"),
        ({"max_tokens": 0}, "sampling.max_tokens: must be >= 1, got 0"),
        ({"temprature": 1.0}, "sampling.temprature: unknown field"),
        ({"stop": [None]}, "sampling.stop[0]: must be a string, got null"),
    ],
)
def test_impossible_sampling_is_rejected(fake_runner: Callable, fake_cfg: Callable, sampling: dict,
                                         message: str) -> None:
    engine = LLMEngine(fake_cfg(), runner=fake_runner())
    with pytest.raises(ValueError) as e:
        engine.add_request([1, 2], sampling)
    assert str(e.value).startswith(message)
    assert not engine.has_unfinished()


def test_eos_stops_unless_ignored(fake_runner: Callable, fake_cfg: Callable) -> None:
    runner = fake_runner()
    prompt = [10, 20, 30]
    expected = runner.reference_greedy(prompt, 12)
    eos = expected[3]
    cut = expected.index(eos) + 1
    tok = CharTokenizer([eos])
    llm = LLM(fake_cfg(), runner=runner, tokenizer=tok)  # type: ignore[arg-type]
    stopped, ignored = llm.generate([prompt, prompt], [SamplingArgs(max_tokens=12), GREEDY])
    assert stopped.finish_reason == "stop" and stopped.token_ids == expected[:cut]
    assert stopped.text == tok.decode(expected[:cut])  # eos itself is not text
    assert ignored.finish_reason == "length" and ignored.token_ids == expected


def test_stop_string_ends_output_before_the_match(fake_runner: Callable, fake_cfg: Callable) -> None:
    runner = fake_runner()
    tok = CharTokenizer()
    prompt = "abc"
    expected = tok.decode(runner.reference_greedy(tok.encode(prompt), 12))
    stop = expected[5:7]
    first = expected.find(stop)
    llm = LLM(fake_cfg(), runner=runner, tokenizer=tok)  # type: ignore[arg-type]
    out = llm.generate(prompt, SamplingArgs(max_tokens=12, ignore_eos=True, stop=["\x7f\x7f\x7f", stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == expected[:first]
    assert len(out.token_ids) == first + len(stop)  # generation stopped at the token completing the match
    assert out.prompt == "abc"


def test_text_prompts_need_a_tokenizer(fake_runner: Callable, fake_cfg: Callable) -> None:
    engine = LLMEngine(fake_cfg(), runner=fake_runner())
    with pytest.raises(ValueError, match="prompt: text prompts need a tokenizer, and model.load_format=dummy"):
        engine.add_request("hello")


def test_seeded_sampling_is_reproducible_and_batch_independent(fake_runner: Callable, fake_cfg: Callable) -> None:
    p = SamplingArgs(temperature=1.0, top_k=30, top_p=0.95, seed=123, max_tokens=16, ignore_eos=True)
    alone = LLM(fake_cfg(), runner=fake_runner()).generate([[1, 2, 3]], p)[0]
    others = SamplingArgs(temperature=0.7, max_tokens=16, ignore_eos=True)
    batched = LLM(fake_cfg(), runner=fake_runner()).generate([[9] * 7, [1, 2, 3], [4]], [others, p, others])[1]
    assert alone.token_ids == batched.token_ids
    reseeded = LLM(fake_cfg(), runner=fake_runner()).generate([[1, 2, 3]], {**_as_dict(p), "seed": 124})[0]
    assert reseeded.token_ids != alone.token_ids


def test_unseeded_sampling_follows_the_global_seed(fake_runner: Callable, fake_cfg: Callable) -> None:
    p = SamplingArgs(temperature=1.0, max_tokens=16, ignore_eos=True)

    def run(seed: int) -> list[list[int]]:
        return [o.token_ids for o in LLM(fake_cfg(seed=seed), runner=fake_runner()).generate([[1, 2], [1, 2]], p)]

    a, b = run(0), run(0)
    assert a == b and a[0] != a[1]  # per-request streams differ
    assert run(1) != a


def test_timing_is_recorded_per_token(fake_runner: Callable, fake_cfg: Callable) -> None:
    out = LLM(fake_cfg(), runner=fake_runner()).generate([[1, 2, 3]], GREEDY)[0]
    assert len(out.token_times_s) == len(out.token_ids) == 12
    assert out.ttft_s == out.token_times_s[0] and out.ttft_s is not None and out.ttft_s > 0
    assert out.token_times_s == sorted(out.token_times_s)


def test_engine_step_api_drives_requests_to_completion(fake_runner: Callable, fake_cfg: Callable) -> None:
    runner = fake_runner()
    engine = LLMEngine(fake_cfg(), runner=runner)
    ids = [engine.add_request([i + 1] * (i + 2), GREEDY) for i in range(3)]
    done = {}
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            done[out.request_id] = out
        steps += 1
    assert sorted(done) == ids
    assert steps == 1 + 11  # one prefill step, then a decode step per further token
    assert engine.num_generated_tokens == 36


def _as_dict(p: SamplingArgs) -> dict:
    import attrs

    return attrs.asdict(p)


def test_preempted_sequence_longer_than_the_budget_is_recomputed_in_chunks(
    fake_runner: Callable, fake_cfg: Callable
) -> None:
    # Without chunked prefill, prompts run whole; a preempted sequence that grew past the budget
    # is the exception (else it could never run again).
    runner = fake_runner(num_pages=9, page_size=4)
    cfg = fake_cfg(num_pages=9, max_batched_tokens=16, chunked_prefill=False, prefix_caching=False)
    llm = LLM(cfg, runner=runner)
    prompts = [list(range(1, 15)), list(range(20, 34))]
    outs = llm.generate(prompts, GREEDY)
    assert llm.engine.num_preemptions > 0
    assert [o.token_ids for o in outs] == [runner.reference_greedy(p, 12) for p in prompts]
    assert all(s.num_tokens <= 16 for s in runner.steps if s.is_prefill)
    assert any(not c.needs_logits for s in runner.steps for c in s.seqs)  # a recompute was split


def test_runners_satisfy_the_declared_protocols(fake_runner: Callable, missing_members: Callable) -> None:
    """The engine reaches the runner only through `Runner`, so the real eager runner and the fake
    must both carry every member it declares; the engine's Sequence carries what the KV cache uses."""
    import attrs

    model = attrs.evolve(tiny_model_args(), load_format=LoadFormat.DUMMY)
    eager = ModelRunner(XrtConfig(model=model, device=Device.CPU, cache=CacheArgs(page_size=4, num_pages=8)))
    fake = fake_runner()
    for runner in (eager, fake):
        assert missing_members(runner, Runner) == []
        assert runner.decode_capacity == 0 and runner.last_argmax is None
        with pytest.raises(NotImplementedError):
            runner.launch_decode(None, None)  # type: ignore[arg-type]
    assert "launch_decode" in missing_members(object(), Runner)  # the check itself sees methods and fields
    assert missing_members(Sequence(0, [1], SamplingArgs(), 0), KVSeq) == []
