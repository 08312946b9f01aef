"""The offline API: `LLM(cfg).generate(prompts)` and `LLM(cfg).chat(messages)`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from xrt.config import SamplingArgs, XrtConfig
from xrt.engine.engine import LLMEngine, Prompt
from xrt.engine.outputs import RequestOutput
from xrt.engine.tokenizer import Message, Tokenizer
from xrt.engine.validate_sampling import validate_sampling
from xrt.executor.interface import Runner
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

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling: SamplingLike | list[SamplingLike] = None,
        use_tqdm: bool | None = None,
        *,
        add_special_tokens: bool = True,
        on_output: Callable[[RequestOutput], None] | None = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. `sampling`: one for all prompts or a list, one each;
        None uses cfg.sampling. A prompt that cannot run comes back with finish_reason "error".
        `on_output`: called with each output as its request finishes (completion order), so a caller can
        keep results that finished before a crash or Ctrl-C."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if isinstance(sampling, list):
            if len(sampling) != len(prompts):
                raise ValueError(f"sampling: got {len(sampling)} entries for {len(prompts)} prompts")
            per_prompt = [validate_sampling(s, self.cfg.sampling) for s in sampling]
        else:
            per_prompt = [validate_sampling(sampling, self.cfg.sampling)] * len(prompts)
        ids = [
            self.engine.add_request(p, s, add_special_tokens=add_special_tokens)
            for p, s in zip(prompts, per_prompt, strict=True)
        ]
        show = len(prompts) >= _PROGRESS_MIN_PROMPTS if use_tqdm is None else use_tqdm
        results: dict[int, RequestOutput] = {}
        wanted = set(ids)
        start = time.perf_counter()
        generated = 0
        with Progress(len(prompts), "generating", "request", show=show) as bar:
            while self.engine.has_unfinished() and len(results) < len(wanted):
                for out in self.engine.step():
                    if out.request_id in wanted:
                        results[out.request_id] = out
                        if on_output is not None:
                            on_output(out)
                        generated += len(out.token_ids)
                        bar.update(1)
                        bar.set_postfix(f"tok_s={generated / max(time.perf_counter() - start, 1e-9):.1f}")
        return [results[i] for i in ids]

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
