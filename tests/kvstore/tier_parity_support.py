"""The checks of tests/kvstore/test_tier_parity_gpu.py (CUDA) and test_tier_parity.py (CPU), device-agnostic: a
model's configuration comes in as overrides (`xrt.load_config`), everything is judged by public behaviour
(RequestOutput.token_ids / cached_tokens, and the logits `llm.engine.runner.execute` returns, recorded by a spy).

The prompts are built so that a prefix served by a tier is the same computation as one served by the GPU prefix
cache: every shared prefix is whole chunks (so whole pages too), every other tail starts with its own token and,
with what it generates, stays inside one chunk, so the GPU prefix cache (cache=gpu) and L1 / L2 (cache=l1_l2)
hit exactly the same tokens and the step after computes the same rows. Greedy tokens, and logits in any dtype,
must then be identical, not merely close. The GPU prefix cache is emptied with a filler prompt that takes every
page (as a workload would); L2 is read by a fresh LLM on the same cache.l2.path."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from xrt.config import SamplingArgs, XrtConfig
from xrt.config.compose import load_config
from xrt.engine.llm import LLM
from xrt.engine.outputs import RequestOutput


@dataclass(frozen=True)
class Shape:
    """A model and the cache geometry its checks use. overrides: the model, dtype, device, executor; pages of
    page_size tokens, chunks of chunk_tokens; tails shorter than max_tail; max_tokens generated per request
    (tail + max_tokens - 1 < chunk_tokens: a request's own tokens never fill a chunk past its shared prefix)."""

    overrides: tuple[str, ...]
    page_size: int
    chunk_tokens: int
    num_pages: int
    vocab: int
    max_tail: int
    max_tokens: int
    l1_size_gb: float

    def __post_init__(self) -> None:
        assert self.chunk_tokens % self.page_size == 0
        assert self.max_tail + self.max_tokens - 1 < self.chunk_tokens


def cfg(shape: Shape, tiers: str, l2_path: Path | None = None) -> XrtConfig:
    over = [*shape.overrides, f"cache={tiers}", f"cache.page_size={shape.page_size}",
            f"cache.num_pages={shape.num_pages}", f"cache.chunk_tokens={shape.chunk_tokens}"]
    if tiers != "gpu":
        # load what the tiers hold (the measured policy would turn on this machine's timing), at admission
        over += [f"cache.l1.size_gb={shape.l1_size_gb}", "cache.l2.load_policy=always", "cache.l2.prefetch=false"]
        if l2_path is not None:
            over.append(f"cache.l2.path={l2_path}")
    return load_config(over)


def make_llm(c: XrtConfig) -> LLM:
    """LLM(c), skipping (not failing) where cache.tiers=l1_l2 finds no NIXL installed."""
    try:
        return LLM(c)
    except RuntimeError as e:
        if type(e).__name__ == "NixlUnavailable":
            pytest.skip(str(e))
        raise


def greedy(n: int) -> SamplingArgs:
    return SamplingArgs(max_tokens=n, ignore_eos=True)


def generate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[RequestOutput]:
    return llm.generate(prompts, greedy(max_tokens), use_tqdm=False)


def evict_gpu(llm: LLM, shape: Shape, rng: random.Random) -> None:
    """A prompt that with its output takes every GPU page: the prefix cache keeps none of the earlier keys (the
    outputs after it say so: cached_tokens["gpu"] 0)."""
    n = shape.num_pages * shape.page_size - shape.max_tokens
    (out,) = generate(llm, [[rng.randrange(1, shape.vocab) for _ in range(n)]], shape.max_tokens)
    assert out.finish_reason == "length"


@dataclass
class Prompts:
    seeds: list[list[int]]  # one per shared prefix: computes and stores it
    batch: list[list[int]]  # the prefixes again, each with tails of its own
    whole: list[int]  # per batch prompt, its shared prefix's tokens (whole chunks)


def prompts(shape: Shape, seed: int, chunks: tuple[int, ...] = (3, 2), per_prefix: int = 2) -> Prompts:
    rng = random.Random(seed)
    firsts = iter(rng.sample(range(1, shape.vocab), len(chunks) * (per_prefix + 1)))  # a tail's own first token

    def tail() -> list[int]:
        return [next(firsts)] + [rng.randrange(1, shape.vocab) for _ in range(rng.randrange(0, shape.max_tail - 1))]

    seeds, batch, whole = [], [], []
    for k in chunks:
        prefix = [rng.randrange(1, shape.vocab) for _ in range(k * shape.chunk_tokens)]
        seeds.append(prefix + tail())
        for _ in range(per_prefix):
            batch.append(prefix + tail())
            whole.append(len(prefix))
    return Prompts(seeds, batch, whole)


def check_l1_l2_outputs_equal_gpu_only(shape: Shape, l2_path: Path, seed: int = 0) -> dict[str, Any]:
    """cache=l1_l2 against cache=gpu, in batches: the seeds (cold in both), then the batch, whose prefixes the
    reference finds in its GPU prefix cache, the tiered engine in L1 (its GPU prefix cache emptied), and a fresh
    tiered engine on the same directory in L2. Returns what each tier served, for the caller to report."""
    p = prompts(shape, seed)
    ref = LLM(cfg(shape, "gpu"))
    want_seeds = [o.token_ids for o in generate(ref, p.seeds, shape.max_tokens)]
    ref_batch = generate(ref, p.batch, shape.max_tokens)
    assert [o.cached_tokens.get("gpu", 0) for o in ref_batch] == p.whole  # the reference's prefixes: GPU hits
    want = [o.token_ids for o in ref_batch]
    ref.close()

    served: dict[str, Any] = {}
    with make_llm(cfg(shape, "l1_l2", l2_path)) as llm:
        assert [o.token_ids for o in generate(llm, p.seeds, shape.max_tokens)] == want_seeds
        evict_gpu(llm, shape, random.Random(seed + 1))
        got = generate(llm, p.batch, shape.max_tokens)
        assert [o.token_ids for o in got] == want
        hits = [o.cached_tokens for o in got]
        # whole chunks, from L1 (or from the pages a prompt of the same step just loaded): never recomputed
        assert [h["gpu"] + h["l1"] for h in hits] == p.whole and all(h["l2"] == 0 for h in hits), hits
        assert sum(h["l1"] for h in hits) >= sum(set(p.whole)), hits
        served["l1"] = hits
    # the first LLM closed (its L2 writer through its queue): a fresh one finds the chunks in L2
    with make_llm(cfg(shape, "l1_l2", l2_path)) as again:
        got = generate(again, p.batch, shape.max_tokens)
        assert [o.token_ids for o in got] == want
        hits = [o.cached_tokens for o in got]
        # (a prompt of the same step may find its prefix in what another's load just brought up to L1 or the pages)
        assert [sum(h.values()) for h in hits] == p.whole, hits
        assert sum(h["l2"] for h in hits) >= sum(set(p.whole)), hits
        served["l2"] = hits
    return served


class ExecuteSpy:
    """Wraps llm.engine.runner.execute: the logits of every forward pass the engine ran through it, copied."""

    def __init__(self, llm: LLM) -> None:
        self.logits: list[torch.Tensor] = []
        runner = llm.engine.runner
        real = runner.execute

        def execute(step: Any) -> torch.Tensor:
            out = real(step)
            self.logits.append(out.detach().clone())
            return out

        runner.execute = execute

    def one(self) -> torch.Tensor:
        """The logits of the one pass since the last call (a request of one token: its prefill)."""
        (got,) = self.logits
        self.logits.clear()
        assert got.shape[0] == 1, got.shape
        return got


def check_tier_logits_equal_gpu_hit(shape: Shape, l2_path: Path | None, seed: int = 0, chunks: int = 3) -> None:
    """One prompt whose prefix is `chunks` whole chunks, one token generated: the logits of the pass that computes
    its last prompt token are bit-identical whether the prefix's KV is the GPU prefix cache's pages, was loaded
    from L1 (GPU prefix cache emptied) or, with l2_path, from L2 (a fresh LLM on that directory)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, shape.vocab) for _ in range(chunks * shape.chunk_tokens)]
    first, then = rng.sample(range(1, shape.vocab), 2)
    seed_prompt = prefix + [first] + [rng.randrange(1, shape.vocab) for _ in range(shape.max_tail - 2)]
    prompt = prefix + [then, rng.randrange(1, shape.vocab)]
    n = len(prefix)
    tiers = "l1_l2" if l2_path is not None else "l1"
    with make_llm(cfg(shape, tiers, l2_path)) as llm:
        spy = ExecuteSpy(llm)
        generate(llm, [seed_prompt], 1)
        spy.logits.clear()
        (out,) = generate(llm, [prompt], 1)
        assert out.cached_tokens["gpu"] == n and out.cached_tokens["l1"] == 0, out.cached_tokens
        from_gpu = spy.one()
        evict_gpu(llm, shape, rng)
        spy.logits.clear()
        (again,) = generate(llm, [prompt], 1)
        assert again.cached_tokens["gpu"] == 0 and again.cached_tokens["l1"] == n, again.cached_tokens
        from_l1 = spy.one()
    assert from_gpu.dtype == torch.float32 and torch.isfinite(from_gpu).all()
    assert from_gpu.std() > 0  # logits that say something (not a constant row)
    assert torch.equal(from_l1, from_gpu), (from_l1 - from_gpu).abs().max()
    assert again.token_ids == out.token_ids
    if l2_path is None:
        return
    with make_llm(cfg(shape, tiers, l2_path)) as fresh:
        spy = ExecuteSpy(fresh)
        (last,) = generate(fresh, [prompt], 1)
        assert last.cached_tokens == {"gpu": 0, "l1": 0, "l2": n}, last.cached_tokens
        assert torch.equal(spy.one(), from_gpu)
