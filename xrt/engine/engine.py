"""LLMEngine: requests in, one scheduled forward pass per `step()`, finished requests out.

The engine uses the runner only through `xrt.executor.interface.Runner` and the scheduler (which
owns the KV cache manager) only through its public methods; it tells the KV cache where each step
stands (started, launched, read back) and which queued requests were left waiting, for whatever
tier connector the runner gave it (one that does nothing without tiers). It knows no tier.

Overlapped decoding: with a runner that launches greedy decode steps itself (`decode_capacity` > 0,
the CUDA-graph runner), a decode `step()` launches step N+1 before it reads step N's tokens back, so the
device runs N+1 while the host does the bookkeeping of N (append, stop checks, finishing) and the
caller's work until the next `step()`. Step N+1 takes its input tokens from step N's in-graph argmax
on the device; its positions, slots and pages depend only on lengths. A sequence that finishes at
step N (end-of-sequence, stop string) has a wasted row in step N+1 whose token is dropped. Whenever
the next step cannot be predicted (prefill work, sampling or logprobs: their logits must reach the
host, pages running out) the engine reads back what is in flight and steps synchronously.

Streaming (`step_stream`): a request queued with stream=True is detokenized as it grows and comes out of every
step that gave it a token, as a `StreamOutput` (new token ids, new text); `abort(request_id)` ends a request
wherever it is. `step()` is `step_stream()` keeping the finished requests' outputs: the batch API on top."""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from xrt.config import SamplingArgs, XrtConfig, runtime_check
from xrt.engine.admission import Admission
from xrt.engine.logprobs import TokenLogprob, token_logprobs
from xrt.engine.outputs import RequestOutput, StreamOutput
from xrt.engine.request import Request
from xrt.engine.sampler import sample
from xrt.engine.scheduler import Scheduler
from xrt.engine.sequence import SeqStatus, Sequence
from xrt.engine.stop import finish_reason, stop_holdback
from xrt.engine.tokenizer import Tokenizer, checkpoint_tokenizer
from xrt.engine.validate_prompts import Prompt
from xrt.engine.validate_sampling import validate_sampling
from xrt.executor.interface import PendingTokens, Runner
from xrt.kvcache.connector import TierCounters
from xrt.kvcache.manager import KVCacheManager
from xrt.log import get_logger
from xrt.models.errors import CheckpointError

log = get_logger(__name__)


@dataclass(frozen=True)
class Launch:
    """A decode step on the device whose tokens the host has not read yet."""

    seqs: list[Sequence]
    positions: list[int]  # the position each row fed
    pending: PendingTokens


class LLMEngine:
    def __init__(self, cfg: XrtConfig, runner: Runner | None = None, tokenizer: Tokenizer | None = None) -> None:
        problems = runtime_check(cfg)
        if problems:
            raise ValueError("; ".join(f"{path}: {msg}" for path, msg in problems))
        self.cfg = cfg
        if runner is None:
            from xrt.distributed.factory import build_runner
            from xrt.models.checkpoint import resolve_checkpoint

            # The tokenizer first: a corrupt tokenizer.json or chat template fails in milliseconds, not after
            # the weights load.
            tokenizer = tokenizer or checkpoint_tokenizer(resolve_checkpoint(cfg.model), cfg.chat)
            runner = build_runner(cfg)
        self.runner = runner
        if tokenizer is None:
            tokenizer = checkpoint_tokenizer(runner.checkpoint_dir, cfg.chat)
        if isinstance(tokenizer, Tokenizer):
            if tokenizer.vocab_size > runner.vocab_size:
                # Its ids past the embedding would index out of range in the first forward pass.
                raise CheckpointError(
                    f"{tokenizer.path}: {tokenizer.vocab_size} tokens, more than the model's vocab_size="
                    f"{runner.vocab_size} (config.json)"
                )
        self.tokenizer = tokenizer
        self.eos_token_ids = tokenizer.eos_token_ids if tokenizer else []
        self.max_model_len = runner.max_model_len
        self.vocab_size = runner.vocab_size
        self._kv = KVCacheManager(runner.num_pages, runner.page_size, cfg.cache.prefix_caching, runner.connector)
        self.scheduler = Scheduler(cfg.scheduler, self._kv, self.max_model_len)
        self.admission = Admission(tokenizer, runner.checkpoint_dir, self.vocab_size, self.max_model_len, cfg.scheduler,
                                   runner.num_pages, runner.page_size)
        self._ids = itertools.count()
        # executor.overlap=false turns overlapping off, to measure what it buys.
        self._overlap = runner.decode_capacity > 0 and cfg.executor.overlap
        sc = cfg.scheduler
        log.debug(f"engine: at most {sc.max_num_seqs} sequences and {sc.max_batched_tokens} tokens a step, chunked "
                  f"prefill {'on' if sc.chunked_prefill else 'off'}, prefix caching "
                  f"{'on' if cfg.cache.prefix_caching else 'off'}, overlapped decode {'on' if self._overlap else 'off'}"
                  f", max_model_len {self.max_model_len}, tokenizer {'none' if tokenizer is None else 'loaded'}")
        self._inflight: deque[Launch] = deque()
        self._queued: list[Sequence] = []  # queued since the last step was scheduled (a tier may read ahead)
        self._live: dict[int, Sequence] = {}  # by request id, until taken finished: what abort() finds
        self._touched: dict[Sequence, None] = {}  # streamed requests given a token this step (ordered set)
        self._warned_max_tokens = False
        self._closed = False
        self.num_prefill_tokens = 0
        self.num_generated_tokens = 0

    def add_request(
        self, prompt: Prompt, sampling: SamplingArgs | dict[str, Any] | None = None, *, add_special_tokens: bool = True
    ) -> int:
        """Queues a request; returns its id. A request that is invalid or can never run (see
        `check_request`) raises RequestError (a ValueError) and queues nothing."""
        params = validate_sampling(sampling, self.cfg.sampling)
        return self.queue(self.check_request(prompt, params, add_special_tokens=add_special_tokens))

    def check_request(
        self, prompt: object, sampling: SamplingArgs, *, add_special_tokens: bool = True, where: str = "prompt",
        index: int | None = None,
    ) -> Request:
        """Tokenizes and checks one prompt (sampling already validated); RequestError naming `where` for
        text that is not valid Unicode, token ids that are not ints in [0, vocab_size), an empty prompt,
        or one that can never run: no room under model.max_model_len, more than the KV cache holds."""
        return self.admission.check(prompt, sampling, add_special_tokens=add_special_tokens, where=where, index=index)

    def queue(self, request: Request, *, stream: bool = False) -> int:
        """Queues a checked request; returns its id. stream: hand its tokens and text out after every step
        (`step_stream`), not only once it has finished."""
        request_id = next(self._ids)
        params, ids = request.sampling, request.prompt_token_ids
        left = self.max_model_len - len(ids)
        if params.max_tokens > left and not self._warned_max_tokens:
            # Once per engine: a batch of long prompts would otherwise log a line each.
            self._warned_max_tokens = True
            log.warning(
                f"sampling.max_tokens={params.max_tokens} is more than the {left} tokens model.max_model_len="
                f"{self.max_model_len} leaves after a {len(ids)}-token prompt: generation stops there, with "
                "finish_reason 'context_length' (logged once per engine)"
            )
        seed = params.seed if params.seed is not None else (self.cfg.seed * 1_000_003 + request_id) % 2**63
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=ids,
            sampling=params,
            seed=seed,
            prompt=request.prompt,
            detokenizer=self.tokenizer.detokenizer(len(ids)) if self.tokenizer else None,
            stream=stream,
        )
        self._live[request_id] = seq
        self.scheduler.add(seq)
        self._queued.append(seq)  # prefetched if it is still waiting once a step is scheduled
        return request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.scheduler.has_finished()

    def abort(self, request_id: int) -> bool:
        """Ends a request wherever it is (queued, prefilling, decoding): its pages are freed now, and it comes out
        of the next step() / step_stream() with finish_reason "abort". False for an id that is unknown or has
        finished already. Call it between steps; overlapped decode rows in flight for it are dropped when read."""
        seq = self._live.get(request_id)
        return seq is not None and self.scheduler.abort(seq)

    @property
    def num_requests_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_requests_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV pages held by requests (cached pages nobody holds count as free)."""
        return 1.0 - self._kv.num_free_pages / self._kv.num_pages

    def step(self) -> list[RequestOutput]:
        """Runs one forward pass (if any work is ready); returns the requests that finished."""
        return [d.output for d in self.step_stream() if d.output is not None]

    def step_stream(self) -> list[StreamOutput]:
        """Runs one forward pass (if any work is ready); returns a StreamOutput for every streamed request that got
        a token and for every request that finished (the last one of each, with its RequestOutput)."""
        self._forward()
        finished = self.scheduler.take_finished()
        out = [self._delta(seq, None) for seq in self._touched if seq.status is not SeqStatus.FINISHED]
        self._touched.clear()
        for seq in finished:
            seq.finish_text()
            self._live.pop(seq.request_id, None)
            out.append(self._delta(seq, RequestOutput.from_sequence(seq)))
        return out

    def _delta(self, seq: Sequence, output: RequestOutput | None) -> StreamOutput:
        """What seq has not handed out yet; while it runs, less the end of its text a stop string could start
        with (when the stop string completes, the text is cut before it: that part is never shown)."""
        start = seq.num_prompt_tokens + seq.num_streamed_tokens
        tokens = seq.token_ids[start:]
        text, done = seq.text, seq.num_streamed_chars
        end = len(text) if output is not None or not seq.sampling.stop else len(text) - stop_holdback(
            text[done:], seq.sampling.stop)
        logprobs = seq.logprobs[seq.num_streamed_tokens:] if seq.sampling.logprobs is not None else None
        seq.num_streamed_tokens += len(tokens)
        seq.num_streamed_chars = max(end, done)
        return StreamOutput(seq.request_id, tokens, text[done:end], output, seq.scheduled_at, logprobs)

    def _forward(self) -> None:
        """One step's forward pass and bookkeeping; finished requests wait in the scheduler to be taken."""
        if self._overlap:
            # Keep one launch queued behind the one whose tokens are read here; starting from none,
            # launch two, so every call still yields one step's tokens (the bench counts calls).
            if not self._inflight:
                self._launch_overlapped()
            if self._inflight:
                self._launch_overlapped()
                self._prefetch_waiting()
                self._resolve(self._inflight.popleft())
                if self._inflight:
                    return
        self._step_sync()

    def _step_sync(self) -> None:
        scheduled = self.scheduler.schedule()
        if scheduled is None:
            self._prefetch_waiting()
            return
        step = scheduled.step
        seqs = scheduled.sampled_seqs
        if step.is_prefill:
            self.num_prefill_tokens += step.num_tokens
            now = time.perf_counter()
            for seq in scheduled.seqs:
                if seq.scheduled_at is None:
                    seq.scheduled_at = now
        if not step.is_prefill and self._launchable(seqs):
            batch = self.scheduler.decode_batch(seqs, overlapped=False, scheduled=scheduled)
            pending = self.runner.launch_decode(batch, None)
            self._prefetch_waiting()
            tokens = pending.tokens()
            logprobs: list[TokenLogprob | None] = [None] * len(tokens)  # _launchable: no row asks for them
            self.scheduler.postprocess(scheduled)
        else:
            self._kv.step_started(step.is_prefill)
            logits = self.runner.execute(step)
            self._kv.step_launched(step.is_prefill, step.num_tokens)
            self._prefetch_waiting()  # while the device runs the step
            self.scheduler.postprocess(scheduled)
            tokens, logprobs = self._sample(logits, seqs) if seqs else ([], [])
        now = time.perf_counter()
        for seq, token, logprob in zip(seqs, tokens, logprobs, strict=True):
            self._append(seq, token, now, logprob)
        self._kv.step_read_back()  # e.g. a tier's stores of what this step computed

    def _prefetch_waiting(self) -> None:
        """The KV cache's read-ahead (a tier's L2 prefix into L1) for each request queued since the last call that
        the scheduler left waiting: one admitted at once loads at admission, and a prefetch of it would only
        compete with its own prefill. seq.token_ids: the list whose chunk keys the lookup and the stores reuse."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        for seq in queued:
            if seq.status is SeqStatus.WAITING and not seq.page_table:
                self._kv.prefetch(seq.token_ids)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprob | None]]:
        """Each row's token, and its logprob for the rows that ask (None for the others)."""
        generators = [s.generator(logits.device) if s.sampling.temperature > 0 else None for s in seqs]
        params = [s.sampling for s in seqs]
        tokens = sample(logits, params, generators, self.runner.last_argmax)
        return tokens, token_logprobs(logits, tokens, [p.logprobs for p in params])

    def _launchable(self, seqs: list[Sequence]) -> bool:
        return len(seqs) <= self.runner.decode_capacity and not any(s.host_sampled for s in seqs)

    def _launch_overlapped(self) -> bool:
        """Launch the next decode step while the one in flight (if any) runs; False when it cannot be."""
        seqs = self.scheduler.schedule_overlapped(self.runner.decode_capacity)
        if not seqs:
            return False
        after = self._inflight[-1].pending if self._inflight else None
        batch = self.scheduler.decode_batch(seqs, overlapped=True)
        self._inflight.append(Launch(seqs, batch.positions, self.runner.launch_decode(batch, after)))
        return True

    def _resolve(self, launch: Launch) -> None:
        """Read a launched step's tokens back and do its bookkeeping."""
        tokens = launch.pending.tokens()
        now = time.perf_counter()
        self.scheduler.decode_resolved(launch.seqs, launch.positions, tokens, now, self._append)
        self._kv.step_read_back()

    def _append(self, seq: Sequence, token: int, now: float, logprob: TokenLogprob | None = None) -> None:
        self.num_generated_tokens += 1
        delta = seq.append_token(token, now, logprob)
        if seq.stream:
            self._touched[seq] = None
        reason = finish_reason(seq, delta, self.eos_token_ids, self.max_model_len)
        if reason is not None:
            self.scheduler.finish(seq, reason)

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def tier_stats(self, flush: bool = True) -> TierCounters | None:
        """What the KV tiers did (every rank's L2 writer through its queue first, unless flush=False: the counters
        as they stand, cheap enough to read after every step); None without tiers."""
        return self._kv.tier_stats(flush)

    def close(self) -> None:
        """Read back what is in flight, close the KV tiers (their threads, the L2 writer's queue, the load
        policy's measurements), then the runner (its worker processes); idempotent. Requests still queued or
        running are dropped."""
        if self._closed:
            return
        self._closed = True
        try:
            while self._inflight:
                self._inflight.popleft().pending.tokens()
            self._kv.close()
        finally:
            self.runner.close()

