"""What `xrt run` writes: each result printed as its request finishes (completion order, each line naming its
request, so a Ctrl-C keeps on the terminal what was done), or with `stream=true` the generations as their tokens
arrive; the JSONL `output` file, one flushed line per finished request; the closing summary line."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from xrt.engine.outputs import RequestOutput, StreamOutput


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
    """The sink for `output` (checked before the model loaded: a new file, or output_overwrite=true)."""
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
        "num_cached_tokens": o.num_cached_tokens,
        "cached_tokens": o.cached_tokens,
        "num_preemptions": o.num_preemptions,
    }
    if o.logprobs is not None:
        out["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob, "rank": lp.rank,
                            "top": [list(t) for t in lp.top]} for lp in o.logprobs]
    return out


def _head_line(request_id: int, prompt: object) -> str:
    return f"[{request_id}] {prompt!r} -> "


def _tail(out: RequestOutput) -> str:
    if out.finish_reason == "error":
        return f"(error: {out.error})"
    return f"({len(out.token_ids)} tokens, {out.finish_reason})"


def format_output(out: RequestOutput) -> str:
    prompt = out.prompt if out.prompt is not None else out.prompt_token_ids
    text = "" if out.finish_reason == "error" else f"{out.text!r}  "
    return f"{_head_line(out.request_id, prompt)}{text}{_tail(out)}"


def print_output(out: RequestOutput) -> None:
    print(format_output(out), flush=True)


class StreamPrinter:
    """`stream=true`: the generations on the terminal as tokens arrive, in prompt order. The first unfinished
    request streams live; the others run all the same and what they generate is held until their turn (each
    generation stays one readable block, however many run at once). `flush()` prints the finished requests still
    held (a Ctrl-C keeps them on the terminal)."""

    def __init__(self, ids: list[int], prompts: list[object], out: IO[str] | None = None) -> None:
        self.order, self.prompts = ids, dict(zip(ids, prompts, strict=True))
        self.out = out
        self.pos = 0
        self.held: dict[int, list[str]] = {}
        self.done: dict[int, RequestOutput] = {}
        self.started = False  # the head request's first line is printed

    def _write(self, text: str) -> None:
        out = self.out or sys.stdout
        out.write(text)
        out.flush()

    def delta(self, d: StreamOutput) -> None:
        self.held.setdefault(d.request_id, []).append(d.text)
        if d.output is not None:
            self.done[d.request_id] = d.output
        self._advance()

    def _advance(self) -> None:
        while self.pos < len(self.order):
            head = self.order[self.pos]
            if head not in self.held:
                return
            if not self.started:
                self.started = True
                self._write(_head_line(head, self.prompts[head]))
            self._write("".join(self.held.pop(head)))
            self.held[head] = []
            if head not in self.done:
                return
            self._write(f"\n  {_tail(self.done[head])}\n")
            self.held.pop(head)
            self.pos, self.started = self.pos + 1, False

    def flush(self) -> None:
        """After an interruption: end the line being streamed, then every finished request not yet shown."""
        if self.started:
            self._write("\n")
            self.pos += 1
        for rid in self.order[self.pos:]:
            if rid in self.done:
                self._write(format_output(self.done[rid]) + "\n")


def summary(startup_s: float, outputs: list[RequestOutput], elapsed_s: float) -> str:
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs if o.finish_reason != "error")
    generated = sum(len(o.token_ids) for o in outputs)
    ttfts = [o.ttft_s for o in outputs if o.ttft_s is not None]
    ttft = f", TTFT p50 {statistics.median(ttfts) * 1e3:.1f} ms" if ttfts else ""
    return (
        f"startup {startup_s:.2f} s | {len(outputs)} requests, {prompt_tokens} prompt tokens, "
        f"{generated} generated in {elapsed_s:.2f} s: {generated / max(elapsed_s, 1e-9):.1f} tokens/s{ttft}"
    )


__all__ = ["Sink", "StreamPrinter", "open_output", "print_output", "record", "summary"]
