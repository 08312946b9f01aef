"""tp=2 against tp=1 on the tiny shape (tied embeddings, 4 heads, 2 KV heads), float32, on CPU over gloo: one
spawned pair of ranks serves the whole module. Logits within 1e-4 for prefill and decode steps; greedy tokens
identical for prompts of every length 1..130 in one batch (chunked prefill included), with prefix caching on
(the second pass hits the cache) and off."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from tp_helpers import tiny_config, tp_workers

from xrt.config import CacheArgs, ParallelArgs, SamplingArgs, XrtConfig
from xrt.distributed.driver import TPRunner
from xrt.engine.llm import LLM
from xrt.executor.runner import ModelRunner
from xrt.executor.step import SeqChunk, StepInput
from xrt.units import GB

PAGE = 16
LENGTHS = [1, 2, 15, 16, 17, 64, 129, 130]
GREEDY = SamplingArgs(max_tokens=4, ignore_eos=True)


def config(path: str, tp: int, prefix_caching: bool = True) -> XrtConfig:
    return tiny_config(path, parallel=ParallelArgs(tp=tp, timeout_s=60),
                       cache=CacheArgs(page_size=PAGE, kv_size_gb=0.02, prefix_caching=prefix_caching))


@pytest.fixture(scope="module")
def runners(tiny_checkpoint_diverse: str) -> Iterator[tuple[ModelRunner, TPRunner]]:
    ref = ModelRunner(config(tiny_checkpoint_diverse, 1))
    tp = TPRunner(config(tiny_checkpoint_diverse, 2))
    yield ref, tp
    tp.close()
    assert not tp_workers()


def prefill(lengths: list[int], seed: int) -> StepInput:
    rng = random.Random(seed)
    seqs, page = [], 0
    for n in lengths:
        pages = -(-(n + 8) // PAGE)
        seqs.append(SeqChunk([rng.randrange(2000) for _ in range(n)], 0, list(range(page, page + pages))))
        page += pages
    return StepInput(True, seqs)


def test_prefill_and_decode_logits_match_one_rank(runners: tuple[ModelRunner, TPRunner]) -> None:
    ref, tp = runners
    step = prefill(LENGTHS, seed=0)
    for _ in range(3):
        want, got = ref.execute(step), tp.execute(step)
        assert got.shape == want.shape == (len(LENGTHS), 2048)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        tokens = want.argmax(-1).tolist()
        step = StepInput(False, [
            SeqChunk([t], c.start_pos + len(c.token_ids), c.page_table) for c, t in zip(step.seqs, tokens, strict=True)
        ])


def test_each_rank_sizes_its_own_shard_of_the_kv_cache(runners: tuple[ModelRunner, TPRunner]) -> None:
    ref, tp = runners
    # One of the two KV heads per rank: a page takes half the bytes, so the same budget holds twice the pages.
    assert tp.local.kv_layout.bytes_per_page * 2 == ref.kv_layout.bytes_per_page
    assert tp.num_pages == tp.local.num_pages == int(0.02 * GB) // tp.local.kv_layout.bytes_per_page
    assert tp.num_pages >= 2 * ref.num_pages


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix_caching", "no_prefix_caching"])
def test_greedy_tokens_match_one_rank_for_every_prompt_length(
    runners: tuple[ModelRunner, TPRunner], tiny_checkpoint_diverse: str, prefix_caching: bool
) -> None:
    ref, tp = runners
    rng = random.Random(1)
    base = [rng.randrange(2000) for _ in range(130)]
    prompts = [base[:n] for n in range(1, 131)]  # 8515 tokens: more than one step's budget (chunked)
    one = LLM(config(tiny_checkpoint_diverse, 1, prefix_caching), runner=ref)
    two = LLM(config(tiny_checkpoint_diverse, 2, prefix_caching), runner=tp)
    for attempt in range(2):
        want, got = one.generate(prompts, GREEDY), two.generate(prompts, GREEDY)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert all(len(o.token_ids) == 4 for o in got)
        cached = sum(o.num_cached_tokens for o in got)
        assert cached == sum(o.num_cached_tokens for o in want)
        assert cached > 0 if prefix_caching and attempt == 1 else prefix_caching or cached == 0
    assert len({tuple(o.token_ids) for o in got}) > 10  # the continuations depend on the prompt
