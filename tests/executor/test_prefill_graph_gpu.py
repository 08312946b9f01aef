"""executor.prefill_graph on the GPU against executor=eager: greedy generations identical for batches
of fresh prompts of varied lengths (replayed from captured prefill graphs: padded to a (sequences,
tokens) shape, the padding in a dummy sequence that writes no KV), and steps that fit no graph (a
cached prefix, a later chunk of a long prompt, too many sequences) running eager. Replayed logits
are compared with the eager path on the same runner: bit-identical where the shape is an exact fit
(no padding: the same GEMM shapes and FlashInfer tiles), close otherwise. A tiny Qwen3 shape with
head_dim 128 (FlashInfer's) and dummy bf16 weights."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from xrt.config import (
    CacheArgs,
    DType,
    ExecutorArgs,
    ExecutorKind,
    LoadFormat,
    ModelArgs,
    PrefillAttention,
    SamplingArgs,
    SchedulerArgs,
    XrtConfig,
)
from xrt.executor.step import SeqChunk, StepInput

pytest.importorskip("flashinfer")

VOCAB = 4096
MAX_MODEL_LEN = 2048
PAGE_SIZE = 16
NUM_PAGES = 4096
MAX_TOKENS = 1024  # token buckets 256, 512, 1024; sequence buckets 1, 2, 4, 8


def config(kind: ExecutorKind, prefill_attention: PrefillAttention = PrefillAttention.AUTO) -> XrtConfig:
    model = ModelArgs(
        name="graph-tiny", vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, rope_theta=10000.0,
        max_position_embeddings=4096, max_model_len=MAX_MODEL_LEN, load_format=LoadFormat.DUMMY,
        dtype=DType.BFLOAT16,
    )
    return XrtConfig(
        model=model,
        executor=ExecutorArgs(
            kind=kind, max_batch=8, prefill_graph=kind is ExecutorKind.CUDAGRAPH, prefill_graph_max_tokens=MAX_TOKENS,
            prefill_attention=prefill_attention,
        ),
        cache=CacheArgs(page_size=PAGE_SIZE, num_pages=NUM_PAGES, prefix_caching=True),
        scheduler=SchedulerArgs(max_batched_tokens=MAX_TOKENS),
        seed=11,
    )


class Spy:
    """Records, per prefill step, whether a graph replayed it."""

    def __init__(self, graphs: Any) -> None:
        self.run = graphs.run
        self.steps: list[tuple[StepInput, bool]] = []
        graphs.run = self

    def __call__(self, step: StepInput) -> Any:
        out = self.run(step)
        self.steps.append((step, out is not None))
        return out


@pytest.fixture(scope="module")
def llms() -> tuple[Any, Any, Spy]:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from xrt.engine.llm import LLM

    eager, graph = LLM(config(ExecutorKind.EAGER)), LLM(config(ExecutorKind.CUDAGRAPH))
    return eager, graph, Spy(graph.engine.runner.prefill_graphs)


def generations(llm: Any, prompts: list[list[int]], sampling: list[SamplingArgs]) -> list[tuple[list[int], str]]:
    return [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, sampling, use_tqdm=False)]


def prompts_of(lengths: list[int], rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(1, VOCAB) for _ in range(n)] for n in lengths]


def replayed_steps(spy: Spy, before: int) -> list[tuple[int, int, bool]]:
    """(sequences, tokens, replayed) of each prefill step since `before`."""
    return [(len(s.seqs), s.num_tokens, replayed) for s, replayed in spy.steps[before:]]


def test_prefill_graphs_captured_for_every_shape(llms: tuple[Any, Any, Spy]) -> None:
    graphs = llms[1].engine.runner.prefill_graphs
    assert sorted(graphs.graphs) == sorted((s, t) for s in (1, 2, 4, 8) for t in (256, 512, 1024))
    assert getattr(llms[0].engine.runner, "prefill_graphs", None) is None


@pytest.mark.parametrize("batch", [1, 2, 3, 8])
def test_greedy_generation_identical_to_eager(llms: tuple[Any, Any, Spy], batch: int) -> None:
    eager, graph, spy = llms
    rng = random.Random(batch)
    prompts = prompts_of([rng.randint(1, 120) for _ in range(batch)], rng)
    sampling = [SamplingArgs(max_tokens=rng.randint(1, 24), ignore_eos=True) for _ in range(batch)]
    before = len(spy.steps)
    want = generations(eager, prompts, sampling)
    got = generations(graph, prompts, sampling)
    assert got == want
    assert replayed_steps(spy, before) == [(batch, sum(map(len, prompts)), True)]


def test_exact_fit_has_an_empty_dummy_sequence(llms: tuple[Any, Any, Spy]) -> None:
    eager, graph, spy = llms
    prompts = prompts_of([64] * 4, random.Random(40))  # 4 x 64 = the 256-token bucket
    sampling = [SamplingArgs(max_tokens=16, ignore_eos=True)] * 4
    before = len(spy.steps)
    assert generations(graph, prompts, sampling) == generations(eager, prompts, sampling)
    assert replayed_steps(spy, before) == [(4, 256, True)]


def test_more_sequences_than_the_largest_graph_run_eager(llms: tuple[Any, Any, Spy]) -> None:
    eager, graph, spy = llms
    rng = random.Random(9)
    prompts = prompts_of([rng.randint(1, 40) for _ in range(9)], rng)
    sampling = [SamplingArgs(max_tokens=12, ignore_eos=True)] * 9
    before = len(spy.steps)
    assert generations(graph, prompts, sampling) == generations(eager, prompts, sampling)
    assert replayed_steps(spy, before) == [(9, sum(map(len, prompts)), False)]


def test_cached_prefix_falls_back_to_eager(llms: tuple[Any, Any, Spy]) -> None:
    eager, graph, spy = llms
    rng = random.Random(21)
    shared = prompts_of([4 * PAGE_SIZE], rng)[0]
    sampling = [SamplingArgs(max_tokens=10, ignore_eos=True)]
    before = len(spy.steps)
    for tail in ([], prompts_of([37], rng)[0]):
        assert generations(graph, [shared + tail], sampling) == generations(eager, [shared + tail], sampling)
    steps = spy.steps[before:]
    assert [(s.seqs[0].start_pos > 0, replayed) for s, replayed in steps] == [(False, True), (True, False)]


def test_long_prompt_first_chunk_replays_the_rest_runs_eager(llms: tuple[Any, Any, Spy]) -> None:
    eager, graph, spy = llms
    prompts = prompts_of([1500], random.Random(33))
    sampling = [SamplingArgs(max_tokens=20, ignore_eos=True)]
    before = len(spy.steps)
    assert generations(graph, prompts, sampling) == generations(eager, prompts, sampling)
    steps = spy.steps[before:]
    assert [(s.seqs[0].start_pos, s.num_tokens, replayed) for s, replayed in steps] == [
        (0, MAX_TOKENS, True), (MAX_TOKENS, 1500 - MAX_TOKENS, False)
    ]


def fresh_prefill(lengths: list[int], rng: random.Random, no_logits: frozenset[int] = frozenset()) -> StepInput:
    pages = list(range(NUM_PAGES))
    rng.shuffle(pages)
    seqs = []
    for i, n in enumerate(lengths):
        k = -(-n // PAGE_SIZE)
        table, pages = pages[:k], pages[k:]
        tokens = [rng.randrange(VOCAB) for _ in range(n)]
        seqs.append(SeqChunk(tokens, 0, table, needs_logits=i not in no_logits))
    return StepInput(True, seqs)


@pytest.mark.parametrize(
    ("lengths", "no_logits", "exact"),
    [
        ([1024], frozenset(), True),
        ([256], frozenset(), True),
        ([64] * 8, frozenset(), True),
        ([100], frozenset(), False),
        ([7, 300, 50], frozenset({1}), False),
        ([33] * 5, frozenset({0, 4}), False),
    ],
)
def test_replayed_logits_against_eager_on_the_same_runner(
    llms: tuple[Any, Any, Spy], lengths: list[int], no_logits: frozenset[int], exact: bool
) -> None:
    runner = llms[1].engine.runner
    spy = llms[2]
    step = fresh_prefill(lengths, random.Random(len(lengths) * 1000 + sum(lengths)), no_logits)
    want = runner.execute_eager(step).clone()
    before = len(spy.steps)
    got = runner.execute(step)
    assert spy.steps[before][1], "the step did not replay a graph"
    assert got.shape == want.shape == (len(lengths) - len(no_logits), VOCAB)
    diff = (got - want).abs().max().item()
    if exact:
        # No padding: the same GEMM shapes, the same FlashInfer tiles and an lm_head over the same rows.
        assert torch.equal(got, want), f"{lengths}: max |graph - eager| = {diff:.3e}"
    else:
        assert diff < 2e-2 * want.abs().max().item(), f"{lengths}: max |graph - eager| = {diff:.3e}"
    assert runner.last_argmax is not None
    assert torch.equal(runner.last_argmax, got.argmax(dim=-1))


@pytest.mark.parametrize("kernel", [PrefillAttention.FA2, PrefillAttention.FA3])
def test_prefill_attention_kernel_replays_and_matches_the_default(llms: tuple[Any, Any, Spy],
                                                                  kernel: PrefillAttention) -> None:
    """executor.prefill_attention picks FlashInfer's kernel for the eager and the graph prefill alike: a runner
    built with it replays logits close to its own eager path's and to the default runner's (bit for bit is asserted
    for the default kernel only, above: a graph wrapper's plan may split the keys otherwise than an eager one's)."""
    from xrt.engine.llm import LLM

    runner = LLM(config(ExecutorKind.CUDAGRAPH, kernel)).engine.runner
    default = llms[1].engine.runner
    for lengths in ([1024], [7, 300, 50]):
        step = fresh_prefill(lengths, random.Random(77 + len(lengths)), frozenset())
        eager = runner.execute_eager(step).clone()
        replays = runner.prefill_graphs.replays
        got = runner.execute(step).clone()
        assert runner.prefill_graphs.replays == replays + 1, f"{lengths}: the step did not replay a graph"
        for name, ref in (("its eager path", eager), ("the default runner", default.execute_eager(step))):
            diff = (got - ref).abs().max().item()
            assert diff < 2e-2 * ref.abs().max().item(), f"{kernel.value} {lengths}: max |graph - {name}| = {diff:.3e}"
