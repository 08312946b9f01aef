"""`xrt serve` over the KV tiers and over tensor parallelism: a prompt served again by a new server on the same L2
directory reports its prefix as cached (from L2) and /metrics shows the tiers' counters; a tp=2 server (gloo)
streams what tp=1 generates offline, and leaves no worker behind."""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from conftest import tiny_config  # noqa: E402
from serve_helpers import clients, metric, metrics, running_server  # noqa: E402

from xrt.config import CacheArgs, KVTiers, L1Args, L2Args, L2LoadPolicy, ParallelArgs, SamplingArgs  # noqa: E402
from xrt.engine.llm import LLM  # noqa: E402

MODEL = "qwen3-tiny"
CHUNK = 16
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def prompt_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2000) for _ in range(n)]


def tiered(path: Path) -> CacheArgs:
    # `always`: load what L2 holds whatever this machine's disk and model timing would choose.
    return CacheArgs(page_size=4, num_pages=256, chunk_tokens=CHUNK, tiers=KVTiers.L1_L2, l1=L1Args(size_gb=0.002),
                     l2=L2Args(path=str(path), load_policy=L2LoadPolicy.ALWAYS))


def test_a_new_server_on_the_same_l2_reports_the_prefix_cached(tiny_checkpoint_diverse: str, tmp_path: Path) -> None:
    prompt = prompt_ids(0, 5 * CHUNK + 3)
    cfg = tiny_config(tiny_checkpoint_diverse, cache=tiered(tmp_path))
    with running_server(cfg) as first:
        client = clients(first.url)[0]
        cold = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, **GREEDY)
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert metric(first.url, "kv_tier_stored_chunks_total", tier="l1") >= 5
        assert metric(first.url, "kv_tier_computed_tokens_total") == len(prompt)
    # closing the first server flushed its L2 writer: the second one starts with an empty GPU cache and L1
    with running_server(cfg) as second:
        client = clients(second.url)[0]
        again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, **GREEDY)
        assert again.usage.prompt_tokens_details.cached_tokens == 5 * CHUNK
        got = metrics(second.url)
        assert got['xrt:kv_tier_hit_tokens_total{model_name="qwen3-tiny",tier="l2"}'] == 5 * CHUNK
        assert got['xrt:cached_prompt_tokens_total{model_name="qwen3-tiny",tier="l2"}'] == 5 * CHUNK
        assert got['xrt:kv_tier_loaded_bytes_total{model_name="qwen3-tiny",tier="l2"}'] > 0
        assert got['xrt:kv_tier_checksum_failures_total{model_name="qwen3-tiny"}'] == 0
        assert 'xrt:kv_tier_store_queue_max{model_name="qwen3-tiny"}' in got  # a level: a gauge, no _total
    assert again.choices[0].text == cold.choices[0].text  # the prefix loaded from L2 generates what recomputing did


@pytest.fixture
def no_workers_left() -> Iterator[None]:
    yield
    # the tensor-parallel workers are named by xrt.distributed.launch (tests/distributed/tp_helpers.py: tp_workers)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("xrt-tp-rank")]


def test_a_tp2_server_streams_what_tp1_generates(tiny_checkpoint_diverse: str, no_workers_left: None) -> None:
    prompts = [prompt_ids(s, 9 + 7 * s) for s in range(4)]
    with LLM(tiny_config(tiny_checkpoint_diverse)) as llm:
        want = [o.text for o in llm.generate(prompts, SamplingArgs(max_tokens=12, ignore_eos=True), use_tqdm=False)]
    assert len(set(want)) == len(want)
    cfg = tiny_config(tiny_checkpoint_diverse, parallel=ParallelArgs(tp=2, timeout_s=60))
    with running_server(cfg) as server:
        client = clients(server.url)[0]
        got: list[Any] = []
        for p in prompts:
            chunks = list(client.completions.create(model=MODEL, prompt=p, max_tokens=12, stream=True, **GREEDY))
            assert len(chunks) > 3
            got.append("".join(c.choices[0].text for c in chunks if c.choices))
        whole = client.completions.create(model=MODEL, prompt=prompts, max_tokens=12, **GREEDY)
        assert metric(server.url, "kv_cache_usage_perc") == 0.0
    assert got == want
    assert [c.text for c in whole.choices] == want


def test_without_a_tokenizer_token_ids_serve_and_text_is_refused() -> None:
    """Dummy weights have no tokenizer.json: token-id prompts stream with usage, a text prompt is a 400 naming it."""
    import attrs

    from xrt.config import DType, LoadFormat, XrtConfig
    from xrt.models.tiny import tiny_model_args

    model = attrs.evolve(tiny_model_args(), load_format=LoadFormat.DUMMY, dtype=DType.FLOAT32)
    with running_server(XrtConfig(model=model, device=tiny_config().device)) as server:
        client = clients(server.url)[0]
        chunks = list(client.completions.create(model=MODEL, prompt=prompt_ids(1, 20), max_tokens=9, stream=True,
                                                stream_options={"include_usage": True}, **GREEDY))
        with pytest.raises(Exception, match="tokenizer"):
            client.completions.create(model=MODEL, prompt="text needs a tokenizer", max_tokens=2)
    tokens = [c for c in chunks if c.choices]
    assert len(tokens) == 9 and tokens[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 9
