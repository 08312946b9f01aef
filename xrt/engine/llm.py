"""The offline API: `LLM(cfg).generate(prompts)` and `LLM(cfg).chat(messages)`; `close()` (or `with LLM(cfg) as
llm:`) stops everything the engine started."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from xrt.config import SamplingArgs, XrtConfig
from xrt.engine.engine import LLMEngine, Request
from xrt.engine.errors import RequestError
from xrt.engine.outputs import RequestOutput, StreamOutput
from xrt.engine.tokenizer import Message, Tokenizer
from xrt.engine.validate_prompts import Prompt, as_prompt_list
from xrt.engine.validate_sampling import validate_sampling
from xrt.executor.interface import Runner
from xrt.kvcache.connector import TierCounters
from xrt.progress import Progress

SamplingLike = SamplingArgs | dict[str, Any] | None

# Below this many prompts a progress bar is more noise than help.
_PROGRESS_MIN_PROMPTS = 8


class LLM:
    def __init__(
        self, cfg: XrtConfig | None = None, runner: Runner | None = None, tokenizer: Tokenizer | None = None
    ) -> None:
        """runner / tokenizer: injected parts (tests); by default built from cfg."""
        start = time.perf_counter()
        self.cfg = cfg if cfg is not None else XrtConfig()
        self.engine = LLMEngine(self.cfg, runner=runner, tokenizer=tokenizer)
        self.startup_s = time.perf_counter() - start

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Stop every thread and worker process of the engine: the KV tiers' L2 writer finishes its queue (at most
        cache.l2.flush_timeout_s) and the load policy's measurements are written for the next process; tensor-
        parallel workers leave. Idempotent; the LLM takes no requests after."""
        self.engine.close()

    def stats(self) -> dict[str, Any]:
        """The engine's counters: prompt tokens prefilled, tokens generated, preemptions, and with KV tiers
        `"tiers"` (what each tier supplied and moved: `TierCounters`, whose `summary()` `xrt run` prints and whose
        `as_dict()` bench rows record), every rank's L2 writer through its queue first."""
        e = self.engine
        out: dict[str, Any] = {"prefill_tokens": e.num_prefill_tokens, "generated_tokens": e.num_generated_tokens,
                               "preemptions": e.num_preemptions}
        tiers: TierCounters | None = e.tier_stats()
        if tiers is not None:
            out["tiers"] = tiers
        return out

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling: SamplingLike | list[SamplingLike] = None,
        use_tqdm: bool | None = None,
        *,
        add_special_tokens: bool = True,
        on_output: Callable[[RequestOutput], None] | None = None,
        on_delta: Callable[[StreamOutput], None] | None = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. `prompts`: text, a list of token ids, or a list of
        those; `sampling`: one SamplingArgs or dict (fields over cfg.sampling) for all prompts, or a list
        with one per prompt; None uses cfg.sampling. `on_output`: called with each output as its request
        finishes (completion order), so a caller can keep results that finished before a crash or Ctrl-C.
        `on_delta`: the requests are streamed, and it is called with each StreamOutput as steps produce them
        (new token ids and text; the last one of a request carries its RequestOutput), before `on_output`.

        The whole input is checked before anything is queued: a bad prompt (not text or token ids, text
        that is not valid Unicode, token ids outside [0, vocab_size), empty, no room under
        model.max_model_len, more than the KV cache holds) or bad sampling (any schema problem, a list of
        the wrong length) raises RequestError, a ValueError whose one-line message names the field
        (`prompts[1]: ...`, `sampling.top_p: ...`), and the engine is left as it was."""
        requests = self._check(prompts, sampling, add_special_tokens)
        ids = [self.engine.queue(r, stream=on_delta is not None) for r in requests]
        show = len(ids) >= _PROGRESS_MIN_PROMPTS if use_tqdm is None else use_tqdm
        results: dict[int, RequestOutput] = {}
        wanted = set(ids)
        start, generated_before = time.perf_counter(), self.engine.num_generated_tokens
        with Progress(len(ids), "generating", "request", show=show) as bar:
            while self.engine.has_unfinished() and len(results) < len(wanted):
                for delta in self.engine.step_stream():
                    if delta.request_id not in wanted:
                        continue
                    if on_delta is not None:
                        on_delta(delta)
                    out = delta.output
                    if out is not None:
                        results[out.request_id] = out
                        if on_output is not None:
                            on_output(out)
                        bar.update(1)
                # Every step, not only when a request finishes: a long batch shows its tokens moving from the start.
                generated = self.engine.num_generated_tokens - generated_before
                bar.set_postfix(f"{generated} tokens, {generated / max(time.perf_counter() - start, 1e-9):.1f} tok/s")
                bar.poll()
        return [results[i] for i in ids]

    def _check(self, prompts: object, sampling: object, add_special_tokens: bool) -> list[Request]:
        listed, single = as_prompt_list(prompts)
        n = len(listed)
        if isinstance(sampling, (list, tuple)):
            if len(sampling) != n:
                raise RequestError("sampling", f"got a list of {len(sampling)} for {n} prompt{'s' * (n != 1)}")
            params = [validate_sampling(s, self.cfg.sampling, f"sampling[{i}]") for i, s in enumerate(sampling)]
        else:
            params = [validate_sampling(sampling, self.cfg.sampling)] * n
        return [
            self.engine.check_request(
                p, s, add_special_tokens=add_special_tokens, where="prompt" if single else f"prompts[{i}]", index=i
            )
            for i, (p, s) in enumerate(zip(listed, params, strict=True))
        ]

    def apply_chat_template(self, messages: list[Message], **kwargs: Any) -> str:
        if self.tokenizer is None:
            raise ValueError("chat: needs the checkpoint's tokenizer.json and chat template (dummy weights have none)")
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def chat(
        self, messages: list[Message] | list[list[Message]], sampling: SamplingLike = None, use_tqdm: bool | None = None
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them; the checkpoint's chat
        template is applied with the generation prompt appended."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts: list[Prompt] = [self.apply_chat_template(list(c)) for c in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, sampling, use_tqdm, add_special_tokens=False)
