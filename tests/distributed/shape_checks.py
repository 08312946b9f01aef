"""What the odd-shape tensor-parallel tests share: configs read from a transformers-written checkpoint,
prompts reaching the top of the vocabulary, and the two parity checks against one rank."""

from __future__ import annotations

import random

import attrs
import torch
from tp_helpers import tiny_config

from xrt.config import CacheArgs, ExecutorArgs, ExecutorKind, ParallelArgs, SamplingArgs, XrtConfig
from xrt.distributed.driver import TPRunner
from xrt.engine.llm import LLM
from xrt.executor.runner import ModelRunner
from xrt.executor.step import SeqChunk, StepInput

PAGE = 8
GREEDY = SamplingArgs(max_tokens=6, ignore_eos=True)
BUCKETS = [1, 2, 4, 8]


def config(path: str, tp: int, graphs: bool = False) -> XrtConfig:
    from xrt.models.loader import read_hf_config
    from xrt.reflect import hf_values

    cfg = tiny_config(path, parallel=ParallelArgs(tp=tp, timeout_s=60), cache=CacheArgs(page_size=PAGE, num_pages=600))
    cfg.model = attrs.evolve(cfg.model, **hf_values(type(cfg.model), read_hf_config(path)), max_model_len=256)
    if graphs:
        cfg.executor = ExecutorArgs(kind=ExecutorKind.CUDAGRAPH, buckets=BUCKETS, max_batch=8)
    return cfg


def prompts(n: int, seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 3, 8, 9, 33, 130] + [rng.randrange(1, 131) for _ in range(n - 6)]
    # The top of the vocabulary too: those embedding rows live on the last rank, next to its padding.
    return [[rng.randrange(vocab - 40, vocab) if i % 3 == 0 else rng.randrange(vocab) for i in range(k)]
            for k in lengths[:n]]


def check_parity(ref: ModelRunner, tp: TPRunner, vocab: int) -> None:
    seqs, page = [], 0
    for p in prompts(6, seed=2, vocab=vocab):
        pages = -(-(len(p) + 2) // PAGE)
        seqs.append(SeqChunk(p, 0, list(range(page, page + pages))))
        page += pages
    step = StepInput(True, seqs)
    for _ in range(2):
        want, got = ref.execute(step), tp.execute(step)
        assert got.shape == want.shape == (6, vocab)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        tokens = want.argmax(-1).tolist()
        step = StepInput(False, [SeqChunk([t], c.start_pos + len(c.token_ids), c.page_table)
                                 for c, t in zip(step.seqs, tokens, strict=True)])


def check_generation(one: LLM, two: LLM, vocab: int) -> None:
    # 6 prompts: within the largest graph (overlapped launches); 20: above it (synchronous steps).
    for batch in (prompts(6, seed=3, vocab=vocab), prompts(20, seed=4, vocab=vocab)):
        want, got = one.generate(batch, GREEDY), two.generate(batch, GREEDY)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert len({tuple(o.token_ids) for o in got}) > 3


