"""The checks of test_tier_parity_gpu.py on CPU (tier_parity_support.py): the tiny checkpoint with weights whose
greedy tokens follow the whole context (tests/conftest.py tiny_checkpoint_diverse), float32, eager.
cache=l1_l2's greedy outputs in batches equal cache=gpu's with the prefixes from L1 and, after a restart, L2;
and the logits of the pass computing a prompt's last token are bit-identical whether its prefix is a GPU
prefix-cache hit, loaded from L1 or loaded from L2."""

from __future__ import annotations

from pathlib import Path

import pytest
from tier_parity_support import Shape, check_l1_l2_outputs_equal_gpu_only, check_tier_logits_equal_gpu_hit


@pytest.fixture
def tiny(tiny_checkpoint_diverse: str) -> Shape:
    return Shape(overrides=(f"model.path={tiny_checkpoint_diverse}", "model.dtype=float32", "device=cpu",
                            "executor=eager"),
                 page_size=4, chunk_tokens=16, num_pages=64, vocab=2048, max_tail=6, max_tokens=6, l1_size_gb=0.01)


@pytest.mark.parametrize("seed", [0, 1])
def test_l1_l2_batches_equal_gpu_only(tiny: Shape, tmp_path: Path, seed: int) -> None:
    served = check_l1_l2_outputs_equal_gpu_only(tiny, tmp_path / "l2", seed)
    assert served["l1"] and served["l2"]


@pytest.mark.parametrize("chunks", [1, 3])
def test_logits_of_a_tier_loaded_prefix_are_bit_identical_to_a_gpu_hit(tiny: Shape, tmp_path: Path,
                                                                       chunks: int) -> None:
    check_tier_logits_equal_gpu_hit(tiny, tmp_path / "l2", chunks=chunks)
