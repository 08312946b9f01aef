"""Continuous batching. Each step is either a prefill step (chunks of admitted prompts under the
token budget) or a decode step (one token for every running sequence). Prompts get all their
pages on admission, so a partly prefilled sequence always finishes its prefill; when a decode step
runs out of pages the newest running sequence is freed and requeued to be recomputed.

A prompt whose cached prefix continues into a KV tier that must read it first (xrt/kvcache/connector.py
`begin_read`) steps out of the queue into `reading` while the tier reads, and the requests behind it are admitted
meanwhile; once its read is over (`poll_reads`, every step) it goes back to the head of the queue and is admitted
with what was read. The scheduler never waits on a read unless nothing else can run.

Overlapped decoding (`schedule_overlapped`): the engine may launch decode step N+1 before it has
read step N's tokens back; a sequence then has `num_pending_tokens` in flight and is scheduled from
its length (known in advance), never from its tokens."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from xrt.config import SchedulerArgs
from xrt.engine.sequence import SeqStatus, Sequence
from xrt.executor.step import DecodeBatch, SeqChunk, StepInput
from xrt.kvcache.interface import NO_HIT
from xrt.kvcache.manager import KVCacheManager
from xrt.kvcache.plan import TierPlan

# Takes a sampled token: (sequence, token, time it was read back).
OnToken = Callable[[Sequence, int, float], None]


@dataclass(frozen=True)
class ScheduledStep:
    step: StepInput
    seqs: list[Sequence]  # aligned with step.seqs

    @property
    def sampled_seqs(self) -> list[Sequence]:
        """Sequences that get a token this step, in the order of the executor's logits rows."""
        return [s for s, c in zip(self.seqs, self.step.seqs, strict=True) if c.needs_logits]


class Scheduler:
    """What the engine calls: admission_error / add (requests in); schedule, then postprocess after the
    pass (synchronous steps); schedule_overlapped, decode_batch and decode_resolved (decode steps the
    runner launches itself); finish, abort, take_finished, has_unfinished / has_finished, num_running /
    num_waiting. The KV cache manager (`kv`) is the scheduler's: the engine never touches it. Every step the
    scheduler hands out carries the KV tier plan decided since the last one (`StepInput.tiers`, `DecodeBatch.tiers`)."""

    def __init__(self, args: SchedulerArgs, kv: KVCacheManager, max_model_len: int) -> None:
        self.args = args
        self.kv = kv
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.reading: list[Sequence] = []  # out of the queue while a KV tier reads their prefix
        self.newly_finished: list[Sequence] = []
        self.num_preemptions = 0

    def admission_error(self, num_prompt_tokens: int) -> str | None:
        """Why a prompt of this length can never run, or None."""
        return admission_error(num_prompt_tokens, self.max_model_len, self.args, self.kv.num_pages, self.kv.page_size)

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.reading)

    def has_finished(self) -> bool:
        """Whether finished requests wait to be taken (`take_finished`)."""
        return bool(self.newly_finished)

    def schedule(self) -> ScheduledStep | None:
        self._poll_reads(idle=False)
        scheduled = self._schedule_prefill() or self._schedule_decode()
        if scheduled is None and self.reading:
            # nothing runs but reads: wait for one (briefly), then admit what it brought
            self._poll_reads(idle=True)
            scheduled = self._schedule_prefill()
        if scheduled is None and self.waiting and not self.running:
            # The decode pass ended the last running sequence (alone, it filled the cache): its pages are free
            # now, for the sequences it preempted.
            scheduled = self._schedule_prefill()
        if scheduled is None and self.waiting and not self.running and not self.reading:
            # Unreachable: admission refuses prompts the whole cache cannot hold, and a preempted sequence
            # held fewer pages than the cache has, so it fits again alone. End it rather than spin forever.
            seq = self.waiting[0]
            self.finish(seq, "kv_cache", f"{seq.num_tokens} tokens do not fit the free KV cache")
        if scheduled is not None:
            plan = self.kv.take_plan()
            if plan is not None:
                scheduled = ScheduledStep(StepInput(scheduled.step.is_prefill, scheduled.step.seqs, plan),
                                          scheduled.seqs)
        return scheduled

    def _poll_reads(self, idle: bool) -> None:
        """Requests whose read is over go back to the head of the queue, in the order they began reading."""
        if not self.reading:
            return
        done = self.kv.poll_reads(idle)
        for seq in reversed([s for s in self.reading if any(s is d for d in done)]):
            self.reading.remove(seq)
            seq.status = SeqStatus.WAITING
            self.waiting.appendleft(seq)

    def postprocess(self, scheduled: ScheduledStep) -> None:
        """Records the KV the step computed; the caller then appends tokens to `sampled_seqs`."""
        for seq, chunk in zip(scheduled.seqs, scheduled.step.seqs, strict=True):
            seq.num_computed_tokens += len(chunk.token_ids)
            if seq.in_prefill and seq.num_computed_tokens == seq.num_tokens:
                seq.in_prefill = False
            self.kv.commit(seq)

    def finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.reading:
            self.reading.remove(seq)
        if seq.page_table:
            self.kv.free(seq)
        else:
            self.kv.drop_read(seq)  # queued or reading: what a tier holds for it is released
        seq.status = SeqStatus.FINISHED
        seq.in_prefill = False
        seq.finish_reason = reason
        seq.error = error
        self.newly_finished.append(seq)

    def abort(self, seq: Sequence) -> bool:
        """Ends seq wherever it is (waiting, reading from a tier, prefilling, decoding) through `finish`, so its pages
        and what a tier holds for it are freed now;
        finish_reason "abort". False when it had finished already. Rows of an overlapped decode step still in
        flight are dropped when read back (`decode_resolved` skips finished sequences)."""
        if seq.status is SeqStatus.FINISHED:
            return False
        self.finish(seq, "abort")
        return True

    @property
    def num_running(self) -> int:
        """Requests admitted to the batch (prefilling or decoding)."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission (preempted ones among them, and those reading their prefix from a tier)."""
        return len(self.waiting) + len(self.reading)

    def take_finished(self) -> list[Sequence]:
        out, self.newly_finished = self.newly_finished, []
        return out

    def schedule_overlapped(self, max_batch: int) -> list[Sequence] | None:
        """The sequences of a decode step that can be launched before the tokens in flight are known,
        with their pages: every running sequence that will not have reached its length limit, in
        running order. None when the next step must be scheduled synchronously: prefill work could
        run first, a sequence samples or asks for logprobs (its token needs the logits on the host), more
        than max_batch sequences run, or pages would run out (the synchronous path preempts). An empty
        list: nothing to launch, every sequence is finishing."""
        kv = self.kv
        self._poll_reads(idle=False)
        if len(self.running) > max_batch:
            return None
        if self.waiting and len(self.running) < self.args.max_num_seqs:
            head = self.waiting[0]
            # A prompt that fits without its cached prefix fits with it, so the prefix is matched (a hash walk over
            # the whole prompt on a hit) only where free pages are short: otherwise the prefill's own `schedule`
            # would walk it a second time on the way to the first token. Only the GPU prefix cache's pages count
            # there (what the tiers hold is loaded into fresh pages), so the tiers' match, which keys the prompt's
            # chunks, is left out: under a full cache it would be made again at every step.
            if kv.can_allocate(head, NO_HIT) or kv.can_allocate(head, kv.gpu_match(head.token_ids)):
                return None
        seqs: list[Sequence] = []
        growing: list[Sequence] = []
        ps, max_len = kv.page_size, self.max_model_len
        for seq in self.running:
            sampling = seq.sampling
            if seq.in_prefill or seq.host_sampled:
                return None
            length = len(seq.token_ids) + seq.num_pending_tokens
            if length - len(seq.prompt_token_ids) >= sampling.max_tokens or length >= max_len:
                continue  # its last token is in flight: it finishes when that token is read
            seqs.append(seq)
            if length > len(seq.page_table) * ps:
                growing.append(seq)
        if len(growing) > kv.num_free_pages:
            return None
        for seq in growing:
            kv.append(seq)
        return seqs

    def decode_batch(self, seqs: list[Sequence], overlapped: bool,
                     scheduled: ScheduledStep | None = None) -> DecodeBatch:
        """A greedy decode step of `seqs` (pages allotted) for `Runner.launch_decode`. A sequence with
        a token in flight feeds it from the device (row `decode_row` of the previous launch).
        overlapped: the step counts as computed now and its tokens come back through `decode_resolved`;
        else the caller reads them and runs `postprocess` as for a synchronous step. scheduled: the step
        `schedule` returned that this batch launches (its tier plan goes with it)."""
        tokens, sources, positions, rows = [], [], [], []
        for i, seq in enumerate(seqs):
            if seq.num_pending_tokens:
                tokens.append(0)
                sources.append(seq.decode_row)
            else:
                tokens.append(seq.token_ids[-1])
                sources.append(-1)
            positions.append(seq.num_computed_tokens)
            rows.append(seq.table_row)
            if overlapped:
                seq.num_computed_tokens += 1
                seq.num_pending_tokens += 1
                seq.decode_row = i
        plan: TierPlan | None = scheduled.step.tiers if scheduled is not None else self.kv.take_plan()
        return DecodeBatch(tokens, sources, positions, rows, self.kv.page_tables, plan)

    def decode_resolved(
        self, seqs: list[Sequence], positions: list[int], tokens: list[int], now: float, on_token: OnToken
    ) -> None:
        """An overlapped decode step's tokens were read back: the KV of each row's position is
        computed (pages that became full are committed), then `on_token(seq, token, now)` appends the
        row's token. Rows of sequences finished meanwhile were wasted: their tokens are dropped. One
        loop with the caller's append, because it runs for every generated token."""
        kv = self.kv
        ps, caching = kv.page_size, kv.prefix_caching
        for seq, token, pos in zip(seqs, tokens, positions, strict=True):
            if seq.status is SeqStatus.FINISHED:
                continue
            seq.num_pending_tokens -= 1
            if caching and (pos + 1) // ps > len(seq.page_hashes):
                kv.commit(seq, pos + 1)  # a page became full
            on_token(seq, token, now)

    def _chunk(self, seq: Sequence, num_tokens: int) -> SeqChunk:
        start = seq.num_computed_tokens
        end = start + num_tokens
        return SeqChunk(
            token_ids=seq.token_ids[start:end],
            start_pos=start,
            page_table=seq.page_table[: self.kv.pages_for(end)],
            needs_logits=end == seq.num_tokens,
        )

    def _schedule_prefill(self) -> ScheduledStep | None:
        kv = self.kv
        budget = self.args.max_batched_tokens
        seqs: list[Sequence] = []
        chunks: list[SeqChunk] = []
        for seq in self.running:
            if not seq.in_prefill:
                continue
            if budget == 0:
                break
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            seqs.append(seq)
            chunks.append(self._chunk(seq, n))
            budget -= n
        # a reading request counts as running: it is about to, and what its read holds stays held until then
        while self.waiting and budget > 0 and len(self.running) + len(self.reading) < self.args.max_num_seqs:
            seq = self.waiting[0]
            hit = kv.lookup(seq.token_ids)
            if kv.begin_read(seq, hit):
                self.waiting.popleft()
                seq.status = SeqStatus.READING
                self.reading.append(seq)
                continue
            remaining = seq.num_tokens - hit.num_tokens
            # Without chunking a prompt runs whole; only a preempted sequence that grew past the
            # budget is split, as the one way it can ever run again.
            if remaining > budget and not self.args.chunked_prefill and seqs:
                break
            if not kv.can_allocate(seq, hit):
                break
            self.waiting.popleft()
            kv.allocate(seq, hit)
            seq.status = SeqStatus.RUNNING
            seq.in_prefill = True
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            seqs.append(seq)
            chunks.append(self._chunk(seq, n))
            budget -= n
        if not seqs:
            return None
        return ScheduledStep(StepInput(is_prefill=True, seqs=chunks), seqs)

    def _schedule_decode(self) -> ScheduledStep | None:
        kv = self.kv
        queue = deque(s for s in self.running if not s.in_prefill)
        scheduled: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            while not kv.can_append(seq) and queue:
                self._preempt(queue.pop())
            if kv.can_append(seq):
                kv.append(seq)
                scheduled.append(seq)
            elif any(s is not seq and s.page_table for s in self.running):
                self._preempt(seq)
            else:
                self.finish(seq, "kv_cache")  # alone, it already fills the whole KV cache
        if not scheduled:
            return None
        chunks = [self._chunk(seq, 1) for seq in scheduled]
        return ScheduledStep(StepInput(is_prefill=False, seqs=chunks), scheduled)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = SeqStatus.WAITING
        seq.in_prefill = False
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)


def admission_error(n: int, max_model_len: int, args: SchedulerArgs, num_pages: int, page_size: int) -> str | None:
    """Why a prompt of n tokens can never run on a KV cache of num_pages pages of page_size, or None."""
    error = length_error(n, max_model_len, args)
    capacity = num_pages * page_size
    if error is None and n + 1 > capacity:
        return (
            f"prompt has {n} tokens but the KV cache holds {capacity} ({num_pages} pages of {page_size}); "
            "raise cache.num_pages or cache.kv_size_gb"
        )
    return error


def length_error(n: int, max_model_len: int, args: SchedulerArgs) -> str | None:
    """Why a prompt of n tokens can never run whatever the KV cache holds (known before a model loads), or None."""
    if n == 0:
        return "prompt is empty"
    if n + 1 > max_model_len:
        return (
            f"prompt has {n} tokens; model.max_model_len={max_model_len} leaves no room to generate "
            f"(at most {max_model_len - 1} prompt tokens)"
        )
    if not args.chunked_prefill and n > args.max_batched_tokens:
        return (
            f"prompt has {n} tokens, more than scheduler.max_batched_tokens={args.max_batched_tokens} "
            "allows with scheduler.chunked_prefill=false"
        )
    return None
