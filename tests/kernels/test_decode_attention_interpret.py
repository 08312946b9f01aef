"""The split-KV decode attention kernel on CPU under TRITON_INTERPRET=1, through the checks of
tests/kernels/test_decode_attention_gpu.py on shapes small enough for the interpreter (it runs each program in Python).
Skipped without triton and on CUDA machines (test_decode_attention_gpu.py runs the compiled kernel)."""

from __future__ import annotations

import pytest
import torch
from interpret_support import Interpreter

INTERPRETER = Interpreter("kernels/test_decode_attention_gpu.py")
checks = INTERPRETER.checks
in_process = INTERPRETER.in_process
CPU = torch.device("cpu")
# Small split_tokens / block_n so short contexts still take many chunks, multi-block chunks and the merge.
MANY = {"split_tokens": 16, "block_n": 16}

# (lens, heads, kv heads, head_dim, page size, kernel kwargs)
CASES = [
    ("batch 1, one chunk", [1], 2, 1, 64, 16, {}),
    ("batch 1, many chunks", [150], 4, 2, 64, 16, MANY),
    ("page boundaries", [16, 32, 48, 64], 4, 2, 64, 16, MANY),
    ("batch 3 random", [37, 1, 90], 4, 2, 128, 16, MANY),
    ("batch 7 with padding", [0, 23, 1, 0, 64, 5, 0], 4, 2, 64, 16, MANY),
    ("gqa 1", [40, 0, 17], 2, 2, 64, 16, MANY),
    ("gqa 4", [40, 3, 0], 8, 2, 64, 16, MANY),
    ("page 1", [20, 0, 33], 4, 2, 64, 1, MANY),
    ("page 8", [9, 24, 0, 1], 4, 2, 64, 8, MANY),
    ("page 32, chunks within a page", [70, 32], 4, 2, 64, 32, MANY),
    ("capped splits, longer chunks", [130, 2], 4, 2, 64, 16, {"split_tokens": 16, "block_n": 16, "max_splits": 2}),
    ("merge in several steps", [300], 8, 1, 64, 8, {"split_tokens": 16, "max_splits": 40}),
    ("default config", [70, 1, 0], 4, 2, 64, 16, {}),
]


# bf16 on the cases that differ in numerics (chunks merged, padding, GQA 4, page 1), not on every layout.
BF16 = {"batch 1, many chunks", "batch 7 with padding", "gqa 4", "page 1", "merge in several steps"}


@in_process
@pytest.mark.parametrize(("dtype", "name", "lens", "heads", "kv_heads", "head_dim", "page_size", "kwargs"), [
    pytest.param(dtype, *c, id=f"{c[0]}-{dtype}") for dtype in (torch.float32, torch.bfloat16) for c in CASES
    if dtype == torch.float32 or c[0] in BF16
])
def test_decode_matches_reference(dtype: torch.dtype, name: str, lens: list[int], heads: int, kv_heads: int,
                                  head_dim: int, page_size: int, kwargs: dict) -> None:
    checks.check_decode(CPU, dtype, lens, heads, kv_heads, head_dim, page_size, **kwargs)


# The fused variant (q/k norm, RoPE and the newest token's KV write in the kernel): one chunk, many chunks with the
# newest token in the last, page boundaries and padding rows, GQA 4, page 1.
ROPE_CASES = ["batch 1, one chunk", "batch 1, many chunks", "page boundaries", "batch 7 with padding", "gqa 4",
              "page 1", "capped splits, longer chunks"]


@in_process
@pytest.mark.parametrize(("dtype", "name", "lens", "heads", "kv_heads", "head_dim", "page_size", "kwargs"), [
    pytest.param(dtype, *c, id=f"{c[0]}-{dtype}") for dtype in (torch.float32, torch.bfloat16) for c in CASES
    if c[0] in ROPE_CASES and (dtype == torch.float32 or c[0] in BF16)
])
def test_rope_variant_matches_the_ops_it_replaces(dtype: torch.dtype, name: str, lens: list[int], heads: int,
                                                  kv_heads: int, head_dim: int, page_size: int, kwargs: dict) -> None:
    checks.check_rope(CPU, dtype, lens, heads, kv_heads, head_dim, page_size, **kwargs)


@in_process
def test_reuse_with_new_metadata() -> None:
    checks.check_reuse(CPU, torch.float32)


@in_process
def test_errors() -> None:
    checks.check_errors(CPU)


@in_process
def test_split_policy() -> None:
    checks.check_split_policy()


@in_process
def test_a_batch_padded_to_its_bucket_gives_the_same_rows() -> None:
    checks.check_padded_to_bucket(CPU, torch.float32)


@in_process
def test_merge_takes_several_steps() -> None:
    """The 'merge in several steps' case really loops in the merge: more chunks than one merge load holds."""
    attn = checks.build(CPU, 8, 1, 64, 8, 1, 300, split_tokens=16, max_splits=40)
    assert attn._merge_s < min(attn.splits_for(1), -(-300 // 16))


@INTERPRETER.subprocess_only
def test_in_subprocess() -> None:
    INTERPRETER.rerun(__file__)
