from __future__ import annotations

from xrt.config import SamplingArgs, SchedulerArgs
from xrt.engine.scheduler import ScheduledStep, Scheduler
from xrt.engine.sequence import SeqStatus, Sequence
from xrt.executor.step import SeqChunk
from xrt.kvcache.manager import KVCacheManager

PS = 4


def make(num_pages: int = 64, budget: int = 16, chunked: bool = True, max_num_seqs: int = 256,
         max_model_len: int = 256, prefix_caching: bool = True) -> Scheduler:
    kv = KVCacheManager(num_pages, PS, prefix_caching)
    args = SchedulerArgs(max_num_seqs=max_num_seqs, max_batched_tokens=budget, chunked_prefill=chunked)
    return Scheduler(args, kv, max_model_len)


def add(s: Scheduler, n: int, request_id: int, max_tokens: int = 4, first: int = 0) -> Sequence:
    seq = Sequence(
        request_id=request_id,
        prompt_token_ids=[(first + i) % 97 for i in range(n)],
        sampling=SamplingArgs(max_tokens=max_tokens),
        seed=0,
    )
    assert s.admission_error(n) is None
    s.add(seq)
    return seq


def run_step(s: Scheduler) -> ScheduledStep | None:
    """One engine step without a model: every sampled sequence gets token 1; max_tokens finishes it."""
    step = s.schedule()
    if step is None:
        return None
    s.postprocess(step)
    for seq in step.sampled_seqs:
        seq.token_ids.append(1)
        if seq.num_output_tokens >= seq.sampling.max_tokens:
            s.finish(seq, "length")
    return step


def drain(s: Scheduler, limit: int = 1000) -> list[ScheduledStep]:
    steps = []
    while s.has_unfinished() and len(steps) < limit:
        step = run_step(s)
        if step is not None:
            steps.append(step)
    assert not s.has_unfinished(), "scheduler did not finish"
    return steps


def chunks_of(steps: list[ScheduledStep], seq: Sequence) -> list[SeqChunk]:
    """seq's prefill chunks, in order."""
    return [c for st in steps if st.step.is_prefill for c, q in zip(st.step.seqs, st.seqs, strict=True) if q is seq]


def test_prefill_steps_respect_the_token_budget_and_chunk_long_prompts() -> None:
    s = make(budget=16)
    seqs = [add(s, n, i, first=10 * i) for i, n in enumerate((5, 30, 3, 12))]
    steps = drain(s)
    for step in steps:
        assert step.step.num_tokens <= 16
    # Every prompt token is computed exactly once, in order, chunk after chunk.
    covered: dict[int, list[int]] = {seq.request_id: [] for seq in seqs}
    for step in steps:
        if not step.step.is_prefill:
            assert all(len(c.token_ids) == 1 for c in step.step.seqs)
            continue
        for seq, chunk in zip(step.seqs, step.step.seqs, strict=True):
            if seq.num_preemptions == 0 and chunk.start_pos < seq.num_prompt_tokens:
                assert chunk.start_pos == len(covered[seq.request_id])
                covered[seq.request_id].extend(chunk.token_ids)
                assert chunk.needs_logits == (chunk.start_pos + len(chunk.token_ids) == seq.num_prompt_tokens)
    for seq in seqs:
        assert covered[seq.request_id] == seq.prompt_token_ids
    assert len(chunks_of(steps, seqs[1])) >= 2


def test_first_prefill_step_fills_the_budget() -> None:
    s = make(budget=16)
    for i, n in enumerate((5, 30, 3)):
        add(s, n, i, first=10 * i)
    step = s.schedule()
    assert step is not None and step.step.is_prefill
    assert [len(c.token_ids) for c in step.step.seqs] == [5, 11]
    assert [c.needs_logits for c in step.step.seqs] == [True, False]


def test_without_chunking_prompts_run_whole() -> None:
    s = make(budget=16, chunked=False)
    for i, n in enumerate((10, 9, 16, 2)):
        add(s, n, i, first=10 * i)
    steps = drain(s)
    for step in steps:
        assert step.step.num_tokens <= 16
        for seq, chunk in zip(step.seqs, step.step.seqs, strict=True):
            if step.step.is_prefill:
                assert chunk.start_pos == 0 and chunk.token_ids == seq.prompt_token_ids
    first = steps[0]
    assert [len(c.token_ids) for c in first.step.seqs] == [10]  # 10 + 9 > 16: the second waits


def test_prompt_over_budget_without_chunking_is_rejected() -> None:
    s = make(budget=16, chunked=False)
    err = s.admission_error(17)
    assert err is not None and "scheduler.max_batched_tokens=16" in err and "chunked_prefill=false" in err


def test_decode_steps_carry_every_running_sequence() -> None:
    s = make(budget=64)
    seqs = [add(s, 3 + i, i, max_tokens=5, first=10 * i) for i in range(4)]
    prefill = run_step(s)
    assert prefill is not None and prefill.step.is_prefill and len(prefill.seqs) == 4
    decode = run_step(s)
    assert decode is not None and not decode.step.is_prefill
    assert decode.seqs == seqs
    for seq, chunk in zip(decode.seqs, decode.step.seqs, strict=True):
        assert chunk.token_ids == [seq.token_ids[-2]] and chunk.start_pos == seq.num_tokens - 2


def test_max_num_seqs_caps_the_batch() -> None:
    s = make(budget=64, max_num_seqs=2)
    for i in range(5):
        add(s, 3, i, first=10 * i)
    for step in drain(s):
        assert len(step.seqs) <= 2


def test_preemption_frees_the_newest_and_recomputes_it() -> None:
    # 6 pages of 4 tokens; three prompts of 5 tokens take 2 pages each, then decoding needs more.
    s = make(num_pages=6, budget=64)
    seqs = [add(s, 5, i, max_tokens=8, first=10 * i) for i in range(3)]
    first = run_step(s)
    assert first is not None and len(first.seqs) == 3 and s.kv.num_free_pages == 0
    for _ in range(4):  # decode until the sequences need a third page each
        run_step(s)
        if s.num_preemptions:
            break
    assert s.num_preemptions >= 1
    assert seqs[0].status is SeqStatus.RUNNING
    assert seqs[2].status is SeqStatus.WAITING and seqs[2].num_preemptions == 1
    assert seqs[2].page_table == [] and seqs[2].num_computed_tokens == 0
    assert s.waiting[0] is seqs[2] or s.waiting[0] is seqs[1]
    steps = drain(s)
    assert all(q.num_output_tokens == 8 for q in seqs)
    # The preempted sequence was prefilled again over its prompt and the tokens it had generated.
    again = chunks_of(steps, seqs[2])
    assert again and again[-1].needs_logits and again[0].start_pos <= 4


def test_a_sequence_that_fills_the_whole_cache_ends_with_kv_cache() -> None:
    s = make(num_pages=2, budget=64)
    seq = add(s, 5, 0, max_tokens=100)
    drain(s)
    assert seq.finish_reason == "kv_cache"
    assert seq.num_tokens == 2 * PS + 1  # 8 slots computed; the last sampled token has nowhere to go


def test_requests_that_can_never_run_are_named() -> None:
    s = make(num_pages=16, max_model_len=32)
    assert "model.max_model_len=32" in (s.admission_error(32) or "")
    assert s.admission_error(31) is None
    assert "KV cache holds 16" in (make(num_pages=4).admission_error(16) or "")
    assert s.admission_error(0) == "prompt is empty"


def test_partial_prefill_keeps_its_pages_while_decode_waits() -> None:
    s = make(budget=8)
    short = add(s, 3, 0, max_tokens=3)
    long = add(s, 20, 1, max_tokens=3, first=40)
    step = s.schedule()
    assert step is not None and step.seqs == [short, long]
    s.postprocess(step)
    short.token_ids.append(1)
    nxt = s.schedule()  # the long prompt's prefill continues before any decode step
    assert nxt is not None and nxt.step.is_prefill and nxt.seqs == [long]
    assert nxt.step.seqs[0].start_pos == 5


def _decoding_with_a_waiting_extension(num_pages: int, other: int = 0) -> tuple[Scheduler, list[Sequence], list[str]]:
    """A decoding 32-token sequence (8 keyed pages, the next step opens a 9th), another of `other` tokens when
    given, and, waiting, a 44-token prompt (11 pages) that starts with those 32 tokens: its cached prefix is 8
    pages the running sequence holds. Returns the scheduler, the running sequences and a list that records the KV
    cache's prefix matches from then on: "gpu" for the GPU prefix cache's, "tiers" for the tiers' (a full lookup
    makes both, gpu first)."""
    s = make(num_pages=num_pages, budget=64)
    running = [add(s, 32, 0, max_tokens=8)] + ([add(s, other, 2, max_tokens=8, first=50)] if other else [])
    step = run_step(s)
    assert step is not None and step.step.is_prefill and not any(q.in_prefill for q in running)
    add(s, 44, 1)
    matches: list[str] = []
    kv, gpu_match, tier_match = s.kv, s.kv.gpu_match, s.kv.connector.match
    kv.gpu_match = lambda ids: matches.append("gpu") or gpu_match(ids)  # type: ignore[method-assign]
    kv.connector.match = lambda ids, gpu: matches.append("tiers") or tier_match(ids, gpu)  # type: ignore[method-assign]
    return s, running, matches


def test_an_overlapped_decode_yields_to_a_waiting_prompt_only_if_it_fits() -> None:
    """schedule_overlapped leaves the step to `schedule` (None: the waiting prompt's prefill goes first) exactly when
    that prompt can be allocated, its cached prefix counted; it matches the prefix only where the prompt does not
    fit without it (a hash walk over the whole prompt, which the prefill's `schedule` makes anyway), and only in the
    GPU prefix cache, whose pages are all that counts there (the tiers' match keys the prompt's chunks)."""
    # 5 free pages: 11 do not fit without the prefix, the 3 past the 8 cached ones do.
    s, _, matches = _decoding_with_a_waiting_extension(13)
    assert s.kv.num_free_pages == 5
    assert s.schedule_overlapped(64) is None
    assert matches == ["gpu"]
    step = s.schedule()
    assert matches == ["gpu", "gpu", "tiers"]  # the prefill's admission: one full lookup
    assert step is not None and step.step.is_prefill and [q.request_id for q in step.seqs] == [1]
    assert step.seqs[0].num_cached_tokens == 32
    # 1 free page (another sequence holds 4): not even with the prefix, so the decode launches (the first
    # sequence opens its 9th page), every step the cache stays full.
    s, running, matches = _decoding_with_a_waiting_extension(13, other=14)
    assert s.kv.num_free_pages == 1
    assert s.schedule_overlapped(64) == running
    assert matches == ["gpu"] and len(running[0].page_table) == 9
    # Free pages for all 11: the prefill goes first, with no match before its own.
    s, _, matches = _decoding_with_a_waiting_extension(40)
    assert s.schedule_overlapped(64) is None
    assert matches == []
    step = s.schedule()
    assert step is not None and step.seqs[0].num_cached_tokens == 32 and matches == ["gpu", "tiers"]
