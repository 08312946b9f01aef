"""`python -m xrt run`: generate from `prompt` or every line of `prompts_file`, print each
generation, optionally write them as JSONL to `output` (each line as its request finishes, so a crash
or Ctrl-C keeps what was done), and end with a startup/throughput summary."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import IO, Any

from xrt.cli.paths import output_problems
from xrt.config import XrtConfig
from xrt.engine.errors import RequestError
from xrt.engine.outputs import RequestOutput
from xrt.reflect import ConfigError

Prompt = str | list[int]


class RunInputError(ValueError):
    pass


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
    try:
        prompts, sources = read_prompts(cfg)
        from xrt.engine.llm import LLM

        llm = closing.enter_context(LLM(cfg))
        if cfg.chat:
            prompts = [llm.apply_chat_template([{"role": "user", "content": _as_text(p)}]) for p in prompts]
        # Opened (and an earlier file replaced) only once the model is up: a failed load leaves it alone.
        with open_output(cfg.output) as sink:
            start = time.perf_counter()
            try:
                outputs = llm.generate(prompts, add_special_tokens=not cfg.chat, on_output=sink.write)
            except KeyboardInterrupt:
                where = f"; their results are in {cfg.output}" if cfg.output else ""
                print(f"interrupted: {sink.count} of {len(prompts)} requests finished{where}", file=sys.stderr)
                raise
            elapsed = time.perf_counter() - start
    except (ValueError, OSError) as e:
        if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
            raise
        if isinstance(e, RequestError) and e.index is not None and e.index < len(sources):
            # LLM.generate names the prompt by its index; the user wrote it in `prompt` or a file's line.
            print(f"error: {sources[e.index]}: {e.message}", file=sys.stderr)
        else:
            print(f"error: {e}", file=sys.stderr)
        return 2
    for out in outputs:
        print_output(out)
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


def _as_text(prompt: Prompt) -> str:
    if not isinstance(prompt, str):
        raise RunInputError("chat: needs text prompts, got token ids")
    return prompt


def read_prompts(cfg: XrtConfig) -> tuple[list[Prompt], list[str]]:
    """The prompts, and where each came from as an error line names it (`prompt`, `prompts_file: f line 3`)."""
    if not cfg.prompts_file:
        return [cfg.prompt], ["prompt"]
    path = cfg.prompts_file
    if not os.path.isfile(path):
        raise RunInputError(f"prompts_file: no such file {path!r}")
    with open(path, "rb") as f:
        data = f.read()
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise RunInputError(
            f"prompts_file: {path} line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    first = next((ln for ln in lines if ln.strip()), "")
    as_jsonl = path.endswith((".jsonl", ".json")) or first.lstrip().startswith("{")
    prompts: list[Prompt] = []
    sources: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        prompts.append(_jsonl_prompt(path, number, line) if as_jsonl else line)
        sources.append(f"prompts_file: {path} line {number}")
    if not prompts:
        raise RunInputError(f"prompts_file: {path!r} holds no prompts")
    return prompts, sources


def _jsonl_prompt(path: str, number: int, line: str) -> Prompt:
    where = f"prompts_file: {path} line {number}"
    try:
        record: Any = json.loads(line)
    except json.JSONDecodeError as e:
        raise RunInputError(f"{where}: not valid JSON ({e.msg})") from None
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return record["prompt"]
    ids = record.get("prompt_token_ids") if isinstance(record, dict) else None
    if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return ids
    raise RunInputError(f'{where}: expected {{"prompt": "<text>"}} or {{"prompt_token_ids": [ints]}}, got {line[:80]}')


class Sink:
    """Appends one JSONL record per finished request and flushes it; with no file it only counts."""

    def __init__(self, f: IO[str] | None) -> None:
        self.f = f
        self.count = 0

    def write(self, o: RequestOutput) -> None:
        self.count += 1
        if self.f is not None:
            self.f.write(json.dumps(record(o), ensure_ascii=False) + "\n")
            self.f.flush()


@contextmanager
def open_output(path: str) -> Iterator[Sink]:
    if not path:
        yield Sink(None)
        return
    with open(path, "w", encoding="utf-8") as f:
        yield Sink(f)


def record(o: RequestOutput) -> dict[str, Any]:
    """One JSONL line; "logprobs" only when sampling.logprobs asked for them (a line per token stays small
    otherwise): per generated token its id, logprob, rank and top [[id, logprob], ...], aligned with token_ids."""
    out = {
        "request_id": o.request_id,
        "prompt": o.prompt,
        "prompt_token_ids": o.prompt_token_ids,
        "text": o.text,
        "token_ids": o.token_ids,
        "finish_reason": o.finish_reason,
        "error": o.error,
        "ttft_s": o.ttft_s,
        "token_times_s": o.token_times_s,
    }
    if o.logprobs is not None:
        out["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob, "rank": lp.rank,
                            "top": [list(t) for t in lp.top]} for lp in o.logprobs]
    return out


def print_output(out: RequestOutput) -> None:
    prompt = out.prompt if out.prompt is not None else out.prompt_token_ids
    print(f"[{out.request_id}] {prompt!r} -> ", end="")
    if out.finish_reason == "error":
        print(f"(error: {out.error})")
    else:
        print(f"{out.text!r}  ({len(out.token_ids)} tokens, {out.finish_reason})")


def summary(startup_s: float, outputs: list[RequestOutput], elapsed_s: float) -> str:
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs if o.finish_reason != "error")
    generated = sum(len(o.token_ids) for o in outputs)
    ttfts = [o.ttft_s for o in outputs if o.ttft_s is not None]
    ttft = f", TTFT p50 {statistics.median(ttfts) * 1e3:.1f} ms" if ttfts else ""
    return (
        f"startup {startup_s:.2f} s | {len(outputs)} requests, {prompt_tokens} prompt tokens, "
        f"{generated} generated in {elapsed_s:.2f} s: {generated / max(elapsed_s, 1e-9):.1f} tokens/s{ttft}"
    )
