"""The profiling step that sizes the CUDA KV cache: the largest prefill the scheduler can build."""

from __future__ import annotations

from xrt.kvcache.sizing import profile_step


def test_profile_step_splits_the_token_budget_by_max_model_len() -> None:
    step = profile_step(max_batched_tokens=2500, max_num_seqs=256, max_model_len=1024, page_size=16)
    assert step.is_prefill
    assert [len(s.token_ids) for s in step.seqs] == [1024, 1024, 452]
    assert step.num_tokens == 2500
    assert all(s.needs_logits and s.start_pos == 0 for s in step.seqs)
    pages = [p for s in step.seqs for p in s.page_table]
    assert pages == list(range(64 + 64 + 29))  # disjoint, each covers its tokens


def test_profile_step_respects_max_num_seqs() -> None:
    step = profile_step(max_batched_tokens=8192, max_num_seqs=2, max_model_len=1024, page_size=16)
    assert [len(s.token_ids) for s in step.seqs] == [1024, 1024]
