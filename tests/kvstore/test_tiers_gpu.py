"""The KV tiers on the GPU, end to end: a prompt's KV restored from L1 (copied up layer group by layer group,
each layer waiting for its own pages) gives the tokens the same prompt gets from the GPU prefix cache, with the
eager and the CUDA-graph executor, on the tiny checkpoint (float32, torch reference attention) and on the
Qwen3-0.6B shape (bf16, FlashInfer)."""

from __future__ import annotations

import random

import pytest
import torch

from xrt.bench.tiers import run_requests, tier_manager
from xrt.config import ExecutorKind, XrtConfig
from xrt.config.compose import load_config
from xrt.engine.engine import LLMEngine


def _phases(cfg: XrtConfig, length: int, reps: int = 2) -> list[dict[str, list[int]]]:
    engine = LLMEngine(cfg)
    graphs = getattr(engine.runner, "decode_graphs", None)
    if graphs is not None:
        assert sorted(graphs.waiting) == [1, 2, 4]  # the buckets up to WAITING_MAX_BATCH
    rng = random.Random(length)
    out = []
    for _ in range(reps):
        prompt = [rng.randrange(1, cfg.model.vocab_size) for _ in range(length)]
        got = {}
        (o,) = run_requests(engine, [prompt], 8)
        got["cold"] = list(o.token_ids)
        tier_manager(engine).flush()
        (o,) = run_requests(engine, [prompt], 8)
        assert o.cached_tokens["gpu"] >= length - cfg.cache.page_size
        got["gpu"] = list(o.token_ids)
        engine.scheduler.kv.evict()
        (o,) = run_requests(engine, [prompt], 8)
        assert o.cached_tokens["l1"] == (length - 1) // cfg.cache.chunk_tokens * cfg.cache.chunk_tokens > 0
        got["l1"] = list(o.token_ids)
        out.append(got)
    engine.close()
    return out


def test_tiny_l1_hit_tokens_equal_the_cold_and_gpu_hit(device: torch.device, tiny_checkpoint_diverse: str) -> None:
    """float32 (the torch reference attention; CUDA graphs need FlashInfer's dtypes): every phase alike."""
    cfg = load_config([f"model.path={tiny_checkpoint_diverse}", "model.dtype=float32", "executor=eager",
                       "cache=l1", "cache.chunk_tokens=32", "cache.num_pages=512", "model.max_model_len=1024"])
    for got in _phases(cfg, 700):
        assert got["cold"] == got["gpu"] == got["l1"]


@pytest.mark.parametrize("kind", [ExecutorKind.EAGER, ExecutorKind.CUDAGRAPH])
def test_0_6b_l1_hit_tokens_equal_the_gpu_hit(device: torch.device, kind: ExecutorKind) -> None:
    """bf16: the restored KV is the same bits as the GPU prefix cache's, and a prompt of whole chunks and one token
    leaves both phases one token to compute, so the same computation gives the same tokens (a cold prefill may
    round differently). With CUDA graphs the L1 phase's step replays the graph that waits for the load."""
    cfg = load_config(["model=qwen3", "model.load_format=dummy", f"executor={kind.value}", "cache=l1",
                       "cache.num_pages=2048", "cache.l1.size_gb=2", "model.max_model_len=4096"])
    for got in _phases(cfg, 12 * 256 + 1):
        assert got["gpu"] == got["l1"]
