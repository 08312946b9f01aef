"""xrt's engine against HF transformers' `generate` on the tiny shape (float32, CPU): greedy
continuations must be identical under every way the scheduler can cut the work. The weights are
tiny_checkpoint_diverse's, so the continuations depend on the whole context."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from xrt.config import CacheArgs, SamplingArgs, SchedulerArgs, XrtConfig
from xrt.engine.llm import LLM

transformers = pytest.importorskip("transformers")

NEW_TOKENS = 32


def parity_prompts() -> list[list[int]]:
    rng = random.Random(1234)
    shared = [rng.randrange(3, 2000) for _ in range(40)]  # 2.5 pages of 16: two full pages to share
    fresh = [[rng.randrange(3, 2000) for _ in range(n)] for n in (1, 9, 23, 2)]
    return [fresh[0], shared + [11, 12, 13], fresh[1], shared + [17], fresh[2], shared[:32] + [5, 6], fresh[3]]


@pytest.fixture(scope="module")
def hf_continuations(tiny_checkpoint_diverse: str) -> list[list[int]]:
    path = tiny_checkpoint_diverse
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for prompt in parity_prompts():
            ids = torch.tensor([prompt])
            gen = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0
            )
            outs.append(gen[0, len(prompt) :].tolist())
    return outs


def greedy_outputs(cfg: XrtConfig) -> tuple[LLM, list[list[int]]]:
    llm = LLM(cfg)
    outs = llm.generate(parity_prompts(), SamplingArgs(max_tokens=NEW_TOKENS))
    for o in outs:
        assert o.error is None and o.finish_reason in ("stop", "length")
    return llm, [o.token_ids for o in outs]


@pytest.mark.parametrize(
    ("cache", "scheduler"),
    [
        (CacheArgs(prefix_caching=True), SchedulerArgs(chunked_prefill=True)),
        (CacheArgs(prefix_caching=False), SchedulerArgs(chunked_prefill=False)),
        (CacheArgs(prefix_caching=True), SchedulerArgs(chunked_prefill=True, max_batched_tokens=16)),
        (CacheArgs(prefix_caching=False), SchedulerArgs(chunked_prefill=True, max_batched_tokens=20)),
    ],
    ids=["prefix-cache", "no-cache-no-chunking", "prefix-cache-chunks-of-16", "no-cache-chunks-of-20"],
)
def test_greedy_matches_hf_generate(
    diverse_cfg: Callable[..., XrtConfig], hf_continuations: list[list[int]], cache: CacheArgs, scheduler: SchedulerArgs
) -> None:
    cache.num_pages = 256
    llm, ours = greedy_outputs(diverse_cfg(cache=cache, scheduler=scheduler))
    assert ours == hf_continuations
    assert all(len(c) == NEW_TOKENS for c in hf_continuations)  # full-length continuations, no early eos
    assert hf_continuations[1] != hf_continuations[3]  # continuations depend on more than the shared prefix
    if cache.prefix_caching:
        assert llm.engine.scheduler.kv.cached  # shared-prefix pages were registered for reuse


def test_shared_prefix_is_served_from_the_cache_and_matches_hf(
    diverse_cfg: Callable[..., XrtConfig], hf_continuations: list[list[int]]
) -> None:
    llm = LLM(diverse_cfg(cache=CacheArgs(num_pages=256, prefix_caching=True)))
    prompts = parity_prompts()
    first = llm.generate(prompts[:2], SamplingArgs(max_tokens=NEW_TOKENS))
    later = llm.generate(prompts[3:6], SamplingArgs(max_tokens=NEW_TOKENS))
    assert first[1].num_cached_tokens == 0
    assert [o.num_cached_tokens for o in later] == [32, 0, 32]
    assert [o.token_ids for o in first + later] == hf_continuations[:2] + hf_continuations[3:6]


def test_preemption_under_a_tiny_kv_cache_still_matches_hf(
    diverse_cfg: Callable[..., XrtConfig], hf_continuations: list[list[int]]
) -> None:
    # 12 pages of 16 tokens: a prompt of 44 plus 32 new tokens alone needs 5 of them.
    llm, ours = greedy_outputs(diverse_cfg(cache=CacheArgs(num_pages=12, prefix_caching=True)))
    assert llm.engine.num_preemptions > 0
    assert ours == hf_continuations


def test_too_long_prompt_fails_alone_while_the_rest_complete(
    diverse_cfg: Callable[..., XrtConfig], hf_continuations: list[list[int]]
) -> None:
    cfg = diverse_cfg(cache=CacheArgs(num_pages=256))
    cfg.model.max_model_len = 64
    prompts = parity_prompts()
    llm = LLM(cfg)
    with pytest.raises(ValueError) as e:
        llm.generate([prompts[0], list(range(3, 67)), prompts[2]], SamplingArgs(max_tokens=NEW_TOKENS))
    assert str(e.value) == (
        "prompts[1]: prompt has 64 tokens; model.max_model_len=64 leaves no room to generate (at most 63 prompt tokens)"
    )
    outs = llm.generate([prompts[0], prompts[2]], SamplingArgs(max_tokens=NEW_TOKENS))
    assert [outs[0].token_ids, outs[1].token_ids] == [hf_continuations[0], hf_continuations[2]]


def test_text_prompts_and_chat_use_the_checkpoint_tokenizer(tiny_cfg: Callable[..., XrtConfig]) -> None:
    llm = LLM(tiny_cfg(cache=CacheArgs(num_pages=64)))
    hf_tok = transformers.AutoTokenizer.from_pretrained(llm.engine.runner.checkpoint_dir)
    text = "The quick brown fox"
    out = llm.generate(text, SamplingArgs(max_tokens=8, ignore_eos=True))[0]
    assert out.prompt_token_ids == hf_tok(text).input_ids
    assert out.text == hf_tok.decode(out.token_ids, skip_special_tokens=True)
    messages = [{"role": "user", "content": "Hi"}]
    chat = llm.chat(messages, SamplingArgs(max_tokens=4, ignore_eos=True))[0]
    rendered = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert llm.apply_chat_template(messages) == rendered
    assert chat.prompt_token_ids == hf_tok(rendered, add_special_tokens=False).input_ids
