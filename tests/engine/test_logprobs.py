"""`sampling.logprobs`: each generated token's log-probability, rank and top-k, against an independent reference:
the fake runners' logits are a function of the context, so log_softmax of them for every prefix of prompt + output
is what each token's entry must hold, under every scheduling path (chunked prefill, preemption and recompute,
overlapped decode beside it, streaming); and the tiny model's against HF transformers on the same tokens, through the
eager runner and the decode graphs' CPU stand-in (in-graph argmax)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
from test_engine_overlap import AsyncFakeRunner, CharTokenizer, prompts
from test_engine_stream import drain, queue_all

from xrt.config import ExecutorArgs, ExecutorKind, SamplingArgs
from xrt.engine.engine import LLMEngine
from xrt.engine.llm import LLM
from xrt.engine.logprobs import TokenLogprob
from xrt.engine.outputs import RequestOutput
from xrt.reflect import ConfigError, build

TOL = 1e-5


def check_against(logits_of: Callable[[list[int]], torch.Tensor], out: RequestOutput, k: int,
                  greedy: bool, tol: float = TOL) -> None:
    """Every token's entry against log_softmax of the logits for the context it was sampled from."""
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) > 0
    context = list(out.prompt_token_ids)
    for token, lp in zip(out.token_ids, out.logprobs, strict=True):
        ref = torch.log_softmax(logits_of(context).double(), dim=-1)
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(ref[token].item(), abs=tol)
        assert lp.rank == int((ref > ref[token] + tol).sum()) + 1
        assert len(lp.top) == k
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        want_top = ref.topk(k)
        assert [t for t, _ in lp.top] == want_top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(want_top.values.tolist(), abs=tol)
        if greedy:
            assert lp.rank == 1 and (k == 0 or lp.top[0][0] == token)
        context.append(token)


def test_the_field_is_bounded() -> None:
    assert build(SamplingArgs, {"logprobs": 20}).logprobs == 20
    for bad in (-1, 21):
        with pytest.raises(ConfigError, match=rf"^logprobs: must be in \[0, 20\], got {bad}"):
            build(SamplingArgs, {"logprobs": bad})


@pytest.mark.parametrize("kind", ["sync", "overlapped"])
@pytest.mark.parametrize(("budget", "num_pages"), [(64, 128), (8, 128), (64, 14)],
                         ids=["plain", "chunked", "preempting"])
def test_logprobs_match_the_logits_under_every_scheduling(
    fake_runner: Callable, fake_cfg: Callable, kind: str, budget: int, num_pages: int
) -> None:
    """A batch mixing greedy and sampled requests with and without logprobs: those that ask get one entry per token,
    equal to the reference, streamed deltas adding up to the final list; the others get None."""
    cfg = fake_cfg(num_pages=num_pages, max_batched_tokens=budget)
    base = fake_runner(num_pages=num_pages, page_size=4)
    runner = base if kind == "sync" else AsyncFakeRunner(base, 64)
    engine = LLMEngine(cfg, runner=runner, tokenizer=CharTokenizer())
    ps = prompts(7)
    asks: list[int | None] = [3, None, 0, None, 5, None, 1, None, 20]
    # The requests without logprobs run longest: alone at the end, the overlapped engine launches them.
    sampling = [SamplingArgs(max_tokens=8 if k is not None else 14, ignore_eos=True, logprobs=k,
                             temperature=0.8 if i % 4 == 2 else 0.0, seed=i, stop=["#"] if i == 4 else [])
                for i, k in enumerate(asks)]
    ids = queue_all(engine, ps, sampling)
    got = drain(engine)

    def logits_of(context: list[int]) -> torch.Tensor:
        return base.context_logits(context, base.vocab_size)

    for rid, k, s in zip(ids, asks, sampling, strict=True):
        deltas = got[rid]
        out = deltas[-1].output
        assert out is not None
        if k is None:
            assert out.logprobs is None and all(d.logprobs is None for d in deltas)
            continue
        check_against(logits_of, out, k, greedy=s.temperature == 0)
        streamed: list[TokenLogprob] = [lp for d in deltas for lp in d.logprobs or []]
        assert streamed == out.logprobs
        assert all(len(d.logprobs or []) == len(d.token_ids) for d in deltas)
    if kind == "overlapped":
        assert runner.launch_sizes
    if num_pages == 14:
        assert engine.num_preemptions > 0  # recomputed sequences kept their logprobs, one per token
    assert engine.kv_cache_usage == 0.0


def test_a_stop_string_cuts_the_text_not_the_tokens_nor_their_logprobs(fake_runner: Callable,
                                                                        fake_cfg: Callable) -> None:
    base = fake_runner()
    tok = CharTokenizer()
    p = prompts(5)[0]
    text = tok.decode(base.reference_greedy(p, 20))
    engine = LLMEngine(fake_cfg(), runner=base, tokenizer=tok)
    (rid,) = queue_all(engine, [p], [SamplingArgs(max_tokens=20, ignore_eos=True, stop=[text[6:9]], logprobs=1)])
    deltas = drain(engine)[rid]
    out = deltas[-1].output
    assert out.finish_reason == "stop" and out.text == text[:6]
    assert len(out.token_ids) == 9  # through the token that completed the stop string, as usage counts them
    check_against(lambda c: base.context_logits(c, base.vocab_size), out, 1, greedy=True)
    assert [lp for d in deltas for lp in d.logprobs or []] == out.logprobs


def test_overlapped_decode_resumes_once_no_request_asks(fake_runner: Callable, fake_cfg: Callable) -> None:
    """A request with logprobs steps synchronously (its logits must reach the host); the others of its batch are
    not hurt: the same tokens, and launches overlap again once it has finished."""
    base = fake_runner()
    runner = AsyncFakeRunner(base, 64)
    engine = LLMEngine(fake_cfg(), runner=runner, tokenizer=CharTokenizer())
    ps = prompts(3, n=3)
    sampling = [SamplingArgs(max_tokens=4, ignore_eos=True, logprobs=2)] + [
        SamplingArgs(max_tokens=16, ignore_eos=True)] * 2
    ids = queue_all(engine, ps, sampling)
    got = drain(engine)
    for rid, p, s in zip(ids, ps, sampling, strict=True):
        assert got[rid][-1].output.token_ids == base.reference_greedy(p, s.max_tokens)
    check_against(lambda c: base.context_logits(c, base.vocab_size), got[ids[0]][-1].output, 2, greedy=True)
    # Launched only without the logprobs request, two steps in flight.
    assert runner.launch_sizes and max(runner.launch_sizes) == 2 and runner.max_in_flight == 2


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint_diverse: str) -> Any:
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint_diverse, dtype=torch.float32)
    return model.eval()


def hf_logits_of(hf: Any) -> Callable[[list[int]], torch.Tensor]:
    def logits_of(context: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([context])).logits[0, -1].float()

    return logits_of


@pytest.mark.parametrize("executor", ["eager", "decode_graphs"])
def test_tiny_model_logprobs_equal_transformers(diverse_cfg: Callable, hf_model: Any, executor: str) -> None:
    from xrt.executor.graphs.capture import RerunCapture
    from xrt.executor.runner import ModelRunner

    cfg = diverse_cfg()
    runner = None
    if executor == "decode_graphs":  # the CPU stand-in of CUDA graphs: replays re-run, argmax in the "graph"
        graph_cfg = attrs.evolve(cfg, executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH, buckets=[1, 2, 4],
                                                            max_batch=4))
        runner = ModelRunner(graph_cfg, capture=RerunCapture())
        graphs, run = runner.decode_graphs, runner.decode_graphs.run
        replays: list[bool] = []

        def counted(*args: Any, **kwargs: Any) -> Any:
            out = run(*args, **kwargs)
            replays.append(out is not None and out[1] is not None)  # replayed, with the in-graph argmax
            return out

        graphs.run = counted  # type: ignore[method-assign]
    with LLM(cfg, runner=runner) as llm:
        prompts_ = ["The river", "Once upon a time there was", "a b c"]
        sampling = [SamplingArgs(max_tokens=6, ignore_eos=True, logprobs=k) for k in (4, None, 0)]
        outs = llm.generate(prompts_, sampling)
    check_against(hf_logits_of(hf_model), outs[0], 4, greedy=True, tol=1e-4)
    check_against(hf_logits_of(hf_model), outs[2], 0, greedy=True, tol=1e-4)
    assert outs[1].logprobs is None
    assert all(lp.logprob < 0 for lp in outs[0].logprobs or [])
    if runner is not None:
        assert replays and all(replays)  # every decode step of the batch went through the graph and its argmax
