"""The KV tiers on the GPU against the GPU prefix cache (issue 23 item 8), by public behaviour only
(tier_parity_support.py; its CPU run is test_tier_parity.py):

(a) cache=l1_l2's greedy outputs on batches of prompts with shared prefixes equal cache=gpu's, with the
    prefixes from L1 (GPU prefix cache emptied) and from L2 (a fresh LLM on the same cache.l2.path): the tiny
    checkpoint in float32 with executor=eager (the torch reference attention), and the Qwen3-0.6B shape in
    bf16 (dummy weights, FlashInfer) with executor=eager and executor=cudagraph. float32 with cudagraph is not
    a case: the CUDA-graph executor needs FlashInfer's dtypes and refuses float32 (tests/e2e/test_e2e_gpu.py).
(b) the logits of the pass that computes a prompt's last token (llm.engine.runner.execute, spied) are
    bit-identical whether the prefix's KV is a GPU prefix-cache hit, was loaded from L1, or from L2 after a
    restart: bf16 on the 0.6B shape (eager, cudagraph) and float32 on the tiny checkpoint.

The prompts make a tier's hit the same computation as the GPU prefix cache's (whole-chunk prefixes, tails inside
one chunk), so "equal" is exact, also in bf16. cache.l2 needs NIXL: without it the l1_l2 cases skip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tier_parity_support import Shape, check_l1_l2_outputs_equal_gpu_only, check_tier_logits_equal_gpu_hit

QWEN3_06B_DUMMY = ("model=qwen3", "model.load_format=dummy", "model.dtype=bfloat16", "device=cuda",
                   "model.max_model_len=4096")


def _tiny(checkpoint: str) -> Shape:
    return Shape(overrides=(f"model.path={checkpoint}", "model.dtype=float32", "device=cuda", "executor=eager"),
                 page_size=4, chunk_tokens=16, num_pages=64, vocab=2048, max_tail=6, max_tokens=6, l1_size_gb=0.01)


def _qwen3_06b(executor: str) -> Shape:
    # chunks of 64 tokens (4 pages of 16): prefixes of 2-3 chunks; 128 pages (2048 tokens) the filler can take
    return Shape(overrides=(*QWEN3_06B_DUMMY, f"executor={executor}"), page_size=16, chunk_tokens=64,
                 num_pages=128, vocab=151936, max_tail=20, max_tokens=8, l1_size_gb=2.0)


def test_tiny_fp32_eager_l1_l2_batches_equal_gpu_only(device: torch.device, tiny_checkpoint_diverse: str,
                                                      tmp_path: Path) -> None:
    for seed in (0, 1):
        served = check_l1_l2_outputs_equal_gpu_only(_tiny(tiny_checkpoint_diverse), tmp_path / f"l2-{seed}", seed)
        assert served["l1"] and served["l2"]


@pytest.mark.parametrize("executor", ["eager", "cudagraph"])
def test_0_6b_bf16_l1_l2_batches_equal_gpu_only(device: torch.device, tmp_path: Path, executor: str) -> None:
    pytest.importorskip("flashinfer")
    served = check_l1_l2_outputs_equal_gpu_only(_qwen3_06b(executor), tmp_path / "l2")
    assert served["l1"] and served["l2"]


@pytest.mark.parametrize("executor", ["eager", "cudagraph"])
def test_0_6b_bf16_tier_loaded_logits_are_bit_identical_to_a_gpu_hit(device: torch.device, tmp_path: Path,
                                                                     executor: str) -> None:
    pytest.importorskip("flashinfer")
    check_tier_logits_equal_gpu_hit(_qwen3_06b(executor), tmp_path / "l2")


def test_0_6b_bf16_l1_loaded_logits_without_l2(device: torch.device) -> None:
    """cache=l1 alone (no NIXL needed): the L1 half of the check above."""
    pytest.importorskip("flashinfer")
    check_tier_logits_equal_gpu_hit(_qwen3_06b("cudagraph"), None)


def test_tiny_fp32_tier_loaded_logits_are_bit_identical_to_a_gpu_hit(device: torch.device,
                                                                     tiny_checkpoint_diverse: str,
                                                                     tmp_path: Path) -> None:
    check_tier_logits_equal_gpu_hit(_tiny(tiny_checkpoint_diverse), tmp_path / "l2")
