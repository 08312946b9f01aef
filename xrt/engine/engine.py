"""LLMEngine: requests in, one scheduled forward pass per `step()`, finished requests out."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Protocol

import attrs
import torch

from xrt.config import SamplingArgs, XrtConfig, runtime_check
from xrt.engine.block_manager import BlockManager
from xrt.engine.outputs import RequestOutput
from xrt.engine.sampler import sample
from xrt.engine.scheduler import Scheduler
from xrt.engine.sequence import Sequence
from xrt.engine.stop import finish_reason
from xrt.engine.tokenizer import Tokenizer
from xrt.executor.step import StepInput

Prompt = str | list[int]


class Runner(Protocol):
    """What the engine needs from `xrt.executor.runner.ModelRunner`."""

    device: torch.device
    num_pages: int
    page_size: int
    max_model_len: int
    checkpoint_dir: str | None

    def execute(self, step: StepInput) -> torch.Tensor: ...


def validate_sampling(sampling: SamplingArgs | dict[str, Any] | None, default: SamplingArgs) -> SamplingArgs:
    """A checked copy; errors name the field: `sampling.top_p: must be in (0.0, 1.0], got 0`."""
    if sampling is None:
        return attrs.evolve(default)
    if isinstance(sampling, dict):
        names = {a.name for a in attrs.fields(SamplingArgs)}
        unknown = sorted(set(sampling) - names)
        if unknown:
            raise ValueError(f"sampling.{unknown[0]}: unknown field (expected one of {', '.join(sorted(names))})")
        with attrs.validators.disabled():
            sampling = attrs.evolve(default, **sampling)
    elif not isinstance(sampling, SamplingArgs):
        raise ValueError(f"sampling: expected SamplingArgs or a dict, got {type(sampling).__name__}")
    for a in attrs.fields(SamplingArgs):
        value = getattr(sampling, a.name)
        if a.validator is None:
            continue
        try:
            a.validator(sampling, a, value)
        except (ValueError, TypeError) as e:
            raise ValueError(f"sampling.{a.name}: {e}") from None
    if not isinstance(sampling.stop, list) or not all(isinstance(s, str) for s in sampling.stop):
        raise ValueError(f"sampling.stop: must be a list of strings, got {sampling.stop!r}")
    return attrs.evolve(sampling, stop=list(sampling.stop))


class LLMEngine:
    def __init__(self, cfg: XrtConfig, runner: Runner | None = None, tokenizer: Tokenizer | None = None) -> None:
        problems = runtime_check(cfg)
        if problems:
            raise ValueError("; ".join(f"{path}: {msg}" for path, msg in problems))
        self.cfg = cfg
        if runner is None:
            from xrt.executor.factory import build_runner

            runner = build_runner(cfg)
        self.runner = runner
        ckpt = runner.checkpoint_dir
        if tokenizer is None and ckpt and os.path.exists(os.path.join(ckpt, "tokenizer.json")):
            tokenizer = Tokenizer(ckpt)
        self.tokenizer = tokenizer
        self.eos_token_ids = tokenizer.eos_token_ids if tokenizer else []
        self.max_model_len = runner.max_model_len
        self.vocab_size: int = getattr(runner, "vocab_size", cfg.model.vocab_size)
        block_manager = BlockManager(runner.num_pages, runner.page_size, cfg.cache.prefix_caching)
        self.scheduler = Scheduler(cfg.scheduler, block_manager, self.max_model_len)
        self._ids = itertools.count()
        self.num_steps = 0
        self.num_prefill_tokens = 0
        self.num_generated_tokens = 0

    def add_request(
        self, prompt: Prompt, sampling: SamplingArgs | dict[str, Any] | None = None, *, add_special_tokens: bool = True
    ) -> int:
        """Queues a request; returns its id. Invalid sampling raises ValueError; a prompt that can
        never run becomes a finished request with finish_reason "error", returned by the next step()."""
        params = validate_sampling(sampling, self.cfg.sampling)
        request_id = next(self._ids)
        text: str | None = None
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "prompt: text prompts need the checkpoint's tokenizer.json (model.load_format=dummy has none); "
                    "pass token ids instead"
                )
            text = prompt
            ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            ids = [int(t) for t in prompt]
        seed = params.seed if params.seed is not None else (self.cfg.seed * 1_000_003 + request_id) % 2**63
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=ids,
            sampling=params,
            seed=seed,
            prompt=text,
            detokenizer=self.tokenizer.detokenizer(len(ids)) if self.tokenizer else None,
        )
        error = self.scheduler.admission_error(len(ids))
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if error is None and bad is not None:
            error = f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})"
        if error is not None:
            self.scheduler.finish(seq, "error", f"request {request_id}: {error}")
        else:
            self.scheduler.add(seq)
        return request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.scheduler.newly_finished)

    def step(self) -> list[RequestOutput]:
        """Runs one forward pass (if any work is ready); returns the requests that finished."""
        scheduled = self.scheduler.schedule()
        if scheduled is not None:
            logits = self.runner.execute(scheduled.step)
            self.num_steps += 1
            if scheduled.step.is_prefill:
                self.num_prefill_tokens += scheduled.step.num_tokens
            self.scheduler.postprocess(scheduled)
            seqs = scheduled.sampled_seqs
            if seqs:
                generators = [s.generator(logits.device) if s.sampling.temperature > 0 else None for s in seqs]
                tokens = sample(logits, [s.sampling for s in seqs], generators)
                now = time.perf_counter()
                self.num_generated_tokens += len(tokens)
                for seq, token in zip(seqs, tokens, strict=True):
                    delta = seq.append_token(token, now)
                    reason = finish_reason(seq, delta, self.eos_token_ids, self.max_model_len)
                    if reason is not None:
                        self.scheduler.finish(seq, reason)
        return [RequestOutput.from_sequence(s) for s in self.scheduler.take_finished()]

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions
