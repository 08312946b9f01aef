"""A prefill step of one token per sequence (a prompt whose prefix came whole from a cache) is run as a decode
step (xrt.executor.step.as_decode): on the CUDA-graph runner it replays the decode graph (CPU: the graph
manager with RerunCapture) and gives the eager prefill's logits; a step with more tokens stays a prefill."""

from __future__ import annotations

import attrs
import torch

from xrt.config import CacheArgs, Device, ExecutorArgs, ExecutorKind, LoadFormat, XrtConfig
from xrt.executor.graphs.capture import RerunCapture
from xrt.executor.runner import ModelRunner
from xrt.executor.step import SeqChunk, StepInput, as_decode
from xrt.models.tiny import tiny_model_args


def test_as_decode_only_for_one_token_chunks_with_logits() -> None:
    one = SeqChunk([5], 12, [0, 1, 2, 3])
    assert as_decode(StepInput(True, [one, one])) == StepInput(False, [one, one])
    for step in (
        StepInput(True, [one, SeqChunk([5, 6], 12, [0, 1, 2, 3])]),  # two tokens
        StepInput(True, [SeqChunk([5], 12, [0, 1, 2, 3], needs_logits=False)]),  # a chunk of a longer prefill
        StepInput(True, []),
        StepInput(False, [one]),
    ):
        assert as_decode(step) is step


def test_a_one_token_prefill_replays_the_decode_graph() -> None:
    model = attrs.evolve(tiny_model_args(), load_format=LoadFormat.DUMMY, max_model_len=64)
    cfg = XrtConfig(model=model, device=Device.CPU, executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH, max_batch=4),
                    cache=CacheArgs(page_size=4, num_pages=64), seed=3)
    runner = ModelRunner(cfg, capture=RerunCapture())
    prompts = [[7, 3, 9, 11, 2, 5, 8, 1, 4], [6, 6, 2, 9, 13]]
    tables = [[10, 11, 12], [20, 21]]
    # the prompts' KV but their last tokens (a prefix hit's pages), then the last tokens as a prefill step
    pairs = list(zip(prompts, tables, strict=True))
    runner.execute(StepInput(True, [SeqChunk(p[:-1], 0, t, needs_logits=False) for p, t in pairs]))
    last = StepInput(True, [SeqChunk(p[-1:], len(p) - 1, t) for p, t in pairs])
    want = runner.execute_eager(last).clone()  # a prefill through the eager path (paged prefill attention)
    got = runner.execute(last)
    assert runner.last_argmax is not None  # only a replayed graph computes the argmax
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(runner.last_argmax, want.argmax(dim=-1))
    two = StepInput(True, [SeqChunk(prompts[0][-2:], len(prompts[0]) - 2, tables[0])])
    runner.execute(two)
    assert runner.last_argmax is None  # a prefill of two tokens runs eager


def test_graphs_that_wait_for_kv_loads_serve_only_small_buckets() -> None:
    """The decode graphs captured with per-layer waits (here no events: CPU) give the plain graph's logits, for the
    buckets up to WAITING_MAX_BATCH; a bigger step finds none (the runner then runs it eager)."""
    from xrt.executor.graphs.decode import WAITING_MAX_BATCH

    model = attrs.evolve(tiny_model_args(), load_format=LoadFormat.DUMMY, max_model_len=64)
    cfg = XrtConfig(model=model, device=Device.CPU, executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH, max_batch=8),
                    cache=CacheArgs(page_size=4, num_pages=64), seed=4)
    runner = ModelRunner(cfg, capture=RerunCapture())
    graphs = runner.decode_graphs
    assert graphs is not None and graphs.waiting == {}  # cache.tiers=gpu: no loads to wait for
    graphs.capture(waits=(None,) * model.num_hidden_layers)
    assert sorted(graphs.waiting) == [b for b in (1, 2, 4, 8) if b <= WAITING_MAX_BATCH]
    steps = [StepInput(False, [SeqChunk([3 + i], 1 + i % 3, [i]) for i in range(n)]) for n in (1, 3, 6)]
    for step in steps[:2]:
        want = graphs.run(step)
        assert want is not None
        want_logits = want[0].clone()
        got = graphs.run(step, waiting=True)
        assert got is not None
        torch.testing.assert_close(got[0], want_logits, rtol=0, atol=0)
    assert graphs.run(steps[2], waiting=True) is None and graphs.run(steps[2]) is not None
