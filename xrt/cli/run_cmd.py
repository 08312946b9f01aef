"""`python -m xrt run`: generate from `prompt` or every line of `prompts_file`, every prompt checked before the
model loads; print each generation as its request finishes (`stream=true`: as its tokens arrive), optionally
write them as JSONL to `output` (each line as its request finishes, so a crash or Ctrl-C keeps what was done),
and end with a startup/throughput summary."""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack

from xrt.cli.paths import input_path, output_problems
from xrt.cli.run_output import StreamPrinter, open_output, print_output, summary
from xrt.cli.run_prompts import Prompt, RunInputError, read_prompts
from xrt.config import XrtConfig
from xrt.engine.errors import RequestError
from xrt.engine.outputs import RequestOutput
from xrt.reflect import ConfigError


def main(cfg: XrtConfig) -> int:
    """0 when every request completed; 1 when some failed (each gets an error line); 2 when nothing ran."""
    # The CLI checks `output` for every job before the first loads a model; this covers direct callers.
    problems = output_problems(cfg)
    if problems:
        for line in ConfigError(problems).lines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    # The LLM _run opens is closed whichever way it ends (an error, Ctrl-C): the tiers' threads and L2 queue, the
    # tensor-parallel workers.
    with ExitStack() as closing:
        return _run(cfg, closing)


def _run(cfg: XrtConfig, closing: ExitStack) -> int:
    sources: list[str] = []
    output = input_path(cfg.output)
    try:
        read = read_prompts(cfg)
        prompts, sources = read.prompts, read.sources
        from xrt.engine.precheck import config_tokenizer, precheck_prompts

        # The tokenizer before the weights: every prompt is checked in a second, not after the model loads.
        tokenizer, checkpoint_dir = config_tokenizer(cfg)
        if cfg.chat:
            if tokenizer is None:
                where = f"none in {checkpoint_dir}" if checkpoint_dir else "model.load_format=dummy has none"
                raise RunInputError([f"chat: needs the checkpoint's tokenizer.json and chat template ({where})"])
            prompts = [tokenizer.apply_chat_template([{"role": "user", "content": _as_text(p, s)}])
                       for p, s in zip(prompts, sources, strict=True)]
        errors = read.errors(precheck_prompts(prompts, cfg, tokenizer, checkpoint_dir, add_special_tokens=not cfg.chat))
        if errors:
            raise RunInputError(errors)
        from xrt.engine.llm import LLM

        llm = closing.enter_context(LLM(cfg, tokenizer=tokenizer))
        # A fresh engine numbers its requests from 0, in the order they are queued: prompt order.
        printer = StreamPrinter(list(range(len(prompts))), list(prompts)) if cfg.stream else None
        # Opened (and an earlier file replaced, with output_overwrite=true) only once the model is up: a failed
        # load leaves it alone.
        with open_output(output) as sink:

            def finished(out: RequestOutput) -> None:
                sink.write(out)
                if printer is None:
                    print_output(out)

            start = time.perf_counter()
            try:
                outputs = llm.generate(prompts, add_special_tokens=not cfg.chat, on_output=finished,
                                       on_delta=printer.delta if printer is not None else None)
            except KeyboardInterrupt:
                if printer is not None:
                    printer.flush()
                where = f"; their results are in {cfg.output}" if cfg.output else ""
                print(f"interrupted: {sink.count} of {len(prompts)} requests finished{where}", file=sys.stderr)
                raise
            elapsed = time.perf_counter() - start
    except (ValueError, OSError) as e:
        if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
            raise
        for line in _error_lines(e, sources):
            print(f"error: {line}", file=sys.stderr)
        return 2
    print(summary(llm.startup_s, outputs, elapsed), flush=True)
    tiers = llm.stats().get("tiers")  # every L2 writer through its queue first: the counts are final
    if tiers is not None:
        print(tiers.summary(), flush=True)
    if cfg.output:
        print(f"wrote {len(outputs)} results to {cfg.output}", flush=True)
    failed = [o for o in outputs if o.finish_reason == "error"]
    for o in failed:
        print(f"error: {o.error}", file=sys.stderr)
    return 1 if failed else 0


def _error_lines(e: ValueError | OSError, sources: list[str]) -> list[str]:
    if isinstance(e, RunInputError):
        return e.lines
    if isinstance(e, RequestError) and e.index is not None and e.index < len(sources):
        # LLM.generate names the prompt by its index; the user wrote it in `prompt` or a file's line.
        return [f"{sources[e.index]}: {e.message}"]
    return [str(e)]


def _as_text(prompt: Prompt, source: str) -> str:
    if not isinstance(prompt, str):
        raise RunInputError([f"{source}: chat=true needs text prompts, got token ids"])
    return prompt
