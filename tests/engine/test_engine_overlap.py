"""Overlapped decoding against synchronous decoding: a fake runner that launches greedy decode steps
itself (the CUDA-graph runner's interface) drives the engine, which launches step N+1 before it
reads step N's tokens. Outputs must be token-identical to the synchronous engine, with the same
finish reasons, stop strings and token limits, and no extra tokens; the fake checks the staged
metadata (positions, slots, page CSR) against the KV it simulates."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from xrt.config import SamplingArgs
from xrt.engine.detokenizer import IncrementalDetokenizer
from xrt.engine.engine import LLMEngine
from xrt.engine.llm import LLM
from xrt.engine.outputs import RequestOutput
from xrt.executor.graphs.decode_inputs import DecodeStaging, stage_decode
from xrt.executor.interface import Runner
from xrt.executor.step import DecodeBatch, StepInput
from xrt.kvcache.pool import page_hash

GREEDY = SamplingArgs(max_tokens=12, ignore_eos=True)
JUNK = 77


class FakePending:
    def __init__(self, runner: AsyncFakeRunner, tokens: list[int], seq_no: int) -> None:
        self.runner = runner
        self.result = tokens
        self.seq_no = seq_no
        self.read = False

    def tokens(self) -> list[int]:
        assert not self.read, "tokens read twice"
        assert self.runner.in_flight[0] is self, "launches must be read back in launch order"
        self.runner.in_flight.pop(0)
        self.read = True
        return list(self.result)


class AsyncFakeRunner:
    """conftest's FakeRunner (used for prefill and sampled steps) plus launch_decode. A launch
    computes its greedy tokens at once, reading the context back through the staged page CSR, but
    hands them to the host only through its pending handle; a source row takes the token of the
    previous launch, which the host has not read yet."""

    def __init__(self, base: Any, capacity: int = 64) -> None:
        self.base = base
        self.device, self.dtype = base.device, base.dtype
        self.num_pages, self.page_size = base.num_pages, base.page_size
        self.max_model_len, self.vocab_size = base.max_model_len, base.vocab_size
        self.checkpoint_dir = None
        self.kv_layout, self.connector = base.kv_layout, base.connector
        self.decode_capacity = capacity
        self.last_argmax = None  # execute() is the base's, which computes no argmax
        max_pages = -(-(base.max_model_len + 1) // base.page_size)
        self.staging = DecodeStaging.zeros(capacity, max_pages)
        self.passes = 0
        self.in_flight: list[FakePending] = []
        self.max_in_flight = 0
        self.launch_sizes: list[int] = []
        self.sourced_rows = 0

    def close(self) -> None:
        pass

    def execute(self, step: StepInput) -> Any:
        assert not self.in_flight, "a synchronous step while decode launches are unread"
        self.passes += 1
        return self.base.execute(step)

    def decode_staging(self) -> DecodeStaging:
        st = self.staging  # junk everywhere: the engine must write every row it launches
        st.rows.fill(JUNK)
        st.kv_indptr.fill(JUNK)
        st.kv_last_page_len.fill(JUNK)
        st.kv_indices.fill(JUNK)
        return st

    def launch_decode(self, batch: DecodeBatch, after: FakePending | None) -> FakePending:
        n = len(batch)
        assert 0 < n <= self.decode_capacity
        # Staged as the CUDA-graph runner stages it, into buffers full of junk.
        stage_decode(self.decode_staging(), batch, n, self.page_size, loop_max_rows=8)
        assert after is None or after.seq_no == self.passes, "sources must refer to the previous pass"
        self.passes += 1
        st, ps, kv = self.staging, self.page_size, self.base.kv
        assert st.kv_indptr[0] == 0
        tokens = []
        for i in range(n):
            tok, pos, slot, src = (int(x) for x in st.rows[:, i])
            if src >= 0:
                assert after is not None and src < len(after.result)
                tok = after.result[src]
                self.sourced_rows += 1
            else:
                assert src == -1
            pages = st.kv_indices[st.kv_indptr[i] : st.kv_indptr[i + 1]].tolist()
            assert len(pages) == pos // ps + 1, f"row {i}: {len(pages)} pages for position {pos}"
            assert st.kv_last_page_len[i] == pos % ps + 1
            assert slot == pages[-1] * ps + pos % ps
            kv[slot] = (tok, pos)
            context = []
            for p in range(pos + 1):
                entry = kv[pages[p // ps] * ps + p % ps]
                assert entry is not None and entry[1] == p, f"slot for position {p} holds {entry}"
                context.append(entry[0])
            tokens.append(int(self.base.context_logits(context, self.vocab_size).argmax()))
        pending = FakePending(self, tokens, self.passes)
        self.in_flight.append(pending)
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        self.launch_sizes.append(n)
        return pending


def test_the_async_fake_is_a_runner(fake_runner: Callable, missing_members: Callable) -> None:
    assert missing_members(AsyncFakeRunner(fake_runner()), Runner) == []


class CharTokenizer:
    """id i <-> chr(32 + i)."""

    def __init__(self, eos_token_ids: list[int] | None = None) -> None:
        self.eos_token_ids = eos_token_ids or []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) - 32 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(32 + i) for i in ids if not (skip_special_tokens and i in self.eos_token_ids))

    def detokenizer(self, num_prompt_tokens: int) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.decode, num_prompt_tokens)


def prompts(seed: int, n: int = 9) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(97) for _ in range(21)]
    out = [[rng.randrange(97) for _ in range(rng.randint(1, 40))] for _ in range(n - 2)]
    return out + [shared + [5], list(shared)]


def summary(outs: list[RequestOutput]) -> list[tuple[list[int], str, str, str | None]]:
    return [(o.token_ids, o.finish_reason, o.text, o.error) for o in outs]


def both(fake_runner: Callable, cfg: Any, run: Callable[[LLM], list[RequestOutput]], capacity: int = 64,
         tokenizer: Any = None, **runner_args: Any) -> tuple[list[RequestOutput], list[RequestOutput], AsyncFakeRunner]:
    """run() on a synchronous engine and on an overlapped one (fresh fake runners, same config)."""
    sync = run(LLM(cfg, runner=fake_runner(**runner_args), tokenizer=tokenizer))
    runner = AsyncFakeRunner(fake_runner(**runner_args), capacity)
    llm = LLM(cfg, runner=runner, tokenizer=tokenizer)
    overlapped = run(llm)
    kv = llm.engine.scheduler.kv
    assert kv.num_free_pages == kv.num_pages, "pages leaked"
    assert not runner.in_flight or not llm.engine.has_unfinished()
    return sync, overlapped, runner


@pytest.mark.parametrize(
    ("prefix_caching", "chunked", "budget", "num_pages"),
    [
        (True, True, 64, 128),
        (False, False, 64, 128),
        (True, True, 8, 128),
        (True, True, 64, 14),  # tiny cache: preemption and page exhaustion fall back to synchronous steps
    ],
)
def test_overlapped_greedy_matches_synchronous(
    fake_runner: Callable, fake_cfg: Callable, prefix_caching: bool, chunked: bool, budget: int, num_pages: int
) -> None:
    cfg = fake_cfg(num_pages=num_pages, max_batched_tokens=budget, chunked_prefill=chunked,
                   prefix_caching=prefix_caching)
    ps = prompts(0)
    sampling = [SamplingArgs(max_tokens=n, ignore_eos=True) for n in (1, 2, 3, 12, 7, 12, 5, 9, 12)]
    sync, overlapped, runner = both(fake_runner, cfg, lambda llm: llm.generate(ps, sampling),
                                    num_pages=num_pages, page_size=4)
    assert summary(overlapped) == summary(sync)
    assert [len(o.token_ids) for o in overlapped] == [s.max_tokens for s in sampling]
    ref = fake_runner(num_pages=num_pages, page_size=4)
    want = [ref.reference_greedy(p, s.max_tokens) for p, s in zip(ps, sampling, strict=True)]
    assert [o.token_ids for o in overlapped] == want
    assert runner.max_in_flight == 2 and runner.sourced_rows > 0  # it did overlap, tokens stayed on the device


def test_stop_strings_eos_and_limits_end_at_the_same_token(fake_runner: Callable, fake_cfg: Callable) -> None:
    runner = fake_runner()
    tok = CharTokenizer()
    ps = prompts(1, n=6)
    expected = [runner.reference_greedy(p, 30) for p in ps]
    eos = expected[0][4]
    tok = CharTokenizer([eos])
    texts = [tok.decode(e) for e in expected]
    stop_of_2 = texts[2][6:8]
    sampling = [
        SamplingArgs(max_tokens=30),  # ends at eos (token 5)
        SamplingArgs(max_tokens=30, ignore_eos=True),
        SamplingArgs(max_tokens=30, ignore_eos=True, stop=["\x7f\x7f", stop_of_2]),
        SamplingArgs(max_tokens=3),
        SamplingArgs(max_tokens=30, stop=["zzzz"]),
        SamplingArgs(max_tokens=1),
    ]
    sync, overlapped, _ = both(fake_runner, fake_cfg(), lambda llm: llm.generate(ps, sampling), tokenizer=tok)
    assert summary(overlapped) == summary(sync)
    assert overlapped[0].finish_reason == "stop" and overlapped[0].token_ids[-1] == eos
    assert overlapped[2].finish_reason == "stop" and overlapped[2].text == texts[2][: texts[2].find(stop_of_2)]
    assert overlapped[1].text == texts[1] and len(overlapped[1].token_ids) == 30
    assert [len(o.token_ids) for o in overlapped[3:]] == [3, len(overlapped[4].token_ids), 1]


def test_max_model_len_caps_overlapped_generation(fake_runner: Callable, fake_cfg: Callable) -> None:
    ps = [list(range(15)), list(range(3))]
    sampling = SamplingArgs(max_tokens=50, ignore_eos=True)
    sync, overlapped, _ = both(fake_runner, fake_cfg(), lambda llm: llm.generate(ps, sampling), max_model_len=20)
    assert summary(overlapped) == summary(sync)
    assert [len(o.token_ids) for o in overlapped] == [5, 17]


def test_sampled_requests_step_synchronously_and_stay_reproducible(fake_runner: Callable, fake_cfg: Callable) -> None:
    p = SamplingArgs(temperature=1.0, top_k=30, seed=5, max_tokens=10, ignore_eos=True)
    ps = prompts(2, n=4)
    sampling = [GREEDY, p, GREEDY, p]
    sync, overlapped, runner = both(fake_runner, fake_cfg(), lambda llm: llm.generate(ps, sampling))
    assert summary(overlapped) == summary(sync)
    # While the sampled requests run every step is synchronous; the greedy tail overlaps.
    assert runner.launch_sizes and max(runner.launch_sizes) <= 2


def test_requests_arriving_mid_decode(fake_runner: Callable, fake_cfg: Callable) -> None:
    ps = prompts(3, n=8)

    def run(llm: LLM) -> list[RequestOutput]:
        engine = llm.engine
        done: dict[int, RequestOutput] = {}
        ids = [engine.add_request(p, SamplingArgs(max_tokens=6 + i, ignore_eos=True)) for i, p in enumerate(ps[:3])]
        steps = 0
        while engine.has_unfinished() or len(ids) < len(ps):
            if steps % 4 == 3 and len(ids) < len(ps):
                ids.append(engine.add_request(ps[len(ids)], SamplingArgs(max_tokens=9, ignore_eos=True)))
            for out in engine.step():
                done[out.request_id] = out
            steps += 1
        return [done[i] for i in ids]

    sync, overlapped, runner = both(fake_runner, fake_cfg(), run)
    assert summary(overlapped) == summary(sync)
    ref = fake_runner()
    assert all(o.token_ids == ref.reference_greedy(p, len(o.token_ids)) for o, p in zip(overlapped, ps, strict=True))
    assert runner.max_in_flight == 2


def test_more_sequences_than_the_launch_capacity(fake_runner: Callable, fake_cfg: Callable) -> None:
    ps = prompts(4, n=9)
    sampling = [SamplingArgs(max_tokens=4 + i, ignore_eos=True) for i in range(9)]
    sync, overlapped, runner = both(fake_runner, fake_cfg(), lambda llm: llm.generate(ps, sampling), capacity=4)
    assert summary(overlapped) == summary(sync)
    assert max(runner.launch_sizes) <= 4 and runner.max_in_flight == 2


def test_decode_filled_pages_are_reused_like_the_synchronous_engine(fake_runner: Callable, fake_cfg: Callable) -> None:
    ps = prompts(5, n=3)

    def run(llm: LLM) -> list[RequestOutput]:
        first = llm.generate(ps, SamplingArgs(max_tokens=13, ignore_eos=True))
        # Prompts that continue the first outputs: their prefix pages were filled by decode steps.
        return first + llm.generate([p + o.token_ids for p, o in zip(ps, first, strict=True)], GREEDY)

    sync, overlapped, _ = both(fake_runner, fake_cfg(), run)
    assert summary(overlapped) == summary(sync)
    assert [o.num_cached_tokens for o in overlapped] == [o.num_cached_tokens for o in sync]
    assert all(o.num_cached_tokens >= 12 for o in overlapped[3:])


def test_synchronous_launches_without_overlap(fake_runner: Callable, fake_cfg: Callable) -> None:
    """With overlapping off, greedy decode steps still go through launch_decode, read back at once."""
    ps = prompts(6, n=5)
    sampling = [SamplingArgs(max_tokens=3 + 2 * i, ignore_eos=True) for i in range(5)]

    def run(llm: LLM) -> list[RequestOutput]:
        llm.engine._overlap = False
        return llm.generate(ps, sampling)

    sync, overlapped, runner = both(fake_runner, fake_cfg(), run)
    assert summary(overlapped) == summary(sync)
    assert runner.max_in_flight == 1 and runner.sourced_rows == 0 and runner.launch_sizes


def test_step_count_and_tokens_match_the_synchronous_engine(fake_runner: Callable, fake_cfg: Callable) -> None:
    """The bench reads the last output_len - 1 steps as the decode steps: overlapping keeps the count."""
    runner = AsyncFakeRunner(fake_runner())
    engine = LLMEngine(fake_cfg(), runner=runner)
    ids = [engine.add_request([i + 1] * (i + 2), GREEDY) for i in range(3)]
    done = {}
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            done[out.request_id] = out
        steps += 1
    assert sorted(done) == ids
    assert steps == 1 + 11
    assert engine.num_generated_tokens == 36
    assert runner.launch_sizes == [3] * 11  # no launch for a row past its last token
    assert not runner.in_flight


@pytest.mark.parametrize("overlap", [False, True])
def test_commit_listeners_see_every_computed_page_once(
    fake_runner: Callable, fake_cfg: Callable, overlap: bool
) -> None:
    """The hook KV tiers store from: through prefill chunks, synchronous and overlapped decoding and
    prefix hits, every full page a request computed is reported exactly once, in order, with its key."""
    runner = fake_runner()
    llm = LLM(fake_cfg(max_batched_tokens=8), runner=AsyncFakeRunner(runner) if overlap else runner)
    kv = llm.engine.scheduler.kv
    covered: dict[int, list[tuple[int, int, list[bytes]]]] = {}
    kv.add_commit_listener(lambda e: covered.setdefault(e.seq.request_id, []).append((e.start, e.end, e.hashes)))
    ps = prompts(7, n=6)
    outs = llm.generate(ps, [SamplingArgs(max_tokens=5 + 3 * i, ignore_eos=True) for i in range(6)])
    assert any(o.num_cached_tokens for o in outs)  # the shared prompts hit the cache
    assert not overlap or llm.engine.runner.max_in_flight == 2  # type: ignore[attr-defined]
    for o in outs:
        tokens = o.prompt_token_ids + o.token_ids
        ranges = covered.get(o.request_id, [])
        starts = [o.num_cached_tokens] + [end for _, end, _ in ranges[:-1]]
        assert [start for start, _, _ in ranges] == starts  # contiguous from the cached prefix, no repeats
        end = (len(tokens) - 1) // kv.page_size * kv.page_size  # the last token's KV is never computed
        assert (ranges[-1][1] if ranges else o.num_cached_tokens) == end
        keys = [page_hash(None, tokens[:4])]
        for i in range(1, end // 4):
            keys.append(page_hash(keys[-1], tokens[4 * i : 4 * i + 4]))
        assert [h for _, _, hs in ranges for h in hs] == keys[o.num_cached_tokens // 4 :]
