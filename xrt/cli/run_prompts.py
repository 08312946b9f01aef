"""`xrt run`'s prompts: `prompt`, or every line of `prompts_file` (JSONL records or plain text), each named by where
it came from (`prompt`, `prompts_file: f line 3`) and all of them checked before a model loads, every bad line
reported (up to MAX_SHOWN, then a count), not only the first."""

from __future__ import annotations

import json
import os
from typing import Any

import attrs

from xrt.cli.paths import input_path
from xrt.config import XrtConfig
from xrt.engine.errors import RequestError

Prompt = str | list[int]
# A file of ten thousand bad lines is not ten thousand error lines.
MAX_SHOWN = 20


class RunInputError(ValueError):
    """Prompts that cannot run: one line each (`prompts_file: f line 3: ...`)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


@attrs.define
class Prompts:
    prompts: list[Prompt]
    sources: list[str]  # per prompt: where it came from, as an error line names it
    bad: list[str] = attrs.Factory(list)  # lines that are no prompt at all, as error lines, in file order
    lines: list[int] = attrs.Factory(list)  # per prompt: its line of the file (0 for `prompt`)
    bad_lines: list[int] = attrs.Factory(list)  # per entry of `bad`

    def errors(self, refused: list[RequestError]) -> list[str]:
        """Every bad line, in file order: those `read_prompts` found and the prompts `refused` (index set)."""
        found = list(zip(self.bad_lines, self.bad, strict=True))
        found += [(self.lines[e.index], f"{self.sources[e.index]}: {e.message}") for e in refused
                  if e.index is not None]
        found.sort(key=lambda item: item[0])
        lines = [text for _, text in found[:MAX_SHOWN]]
        if len(found) > MAX_SHOWN:
            lines.append(f"prompts_file: {len(found) - MAX_SHOWN} more bad lines not shown ({len(found)} in all)")
        return lines


def read_prompts(cfg: XrtConfig) -> Prompts:
    """The prompts of `prompt` or `prompts_file`; RunInputError when the file cannot be read or holds none."""
    if not cfg.prompts_file:
        return Prompts([cfg.prompt], ["prompt"], lines=[0])
    path = input_path(cfg.prompts_file)
    if os.path.isdir(path):
        raise RunInputError([f"prompts_file: {path!r} is a directory; expected a JSONL or text file"])
    if not os.path.isfile(path):
        raise RunInputError([f"prompts_file: no such file {path!r}"])
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RunInputError([f"prompts_file: cannot read {path!r} ({e.strerror or e})"]) from None
    text = data.decode("utf-8", errors="surrogateescape")
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    as_jsonl = path.endswith((".jsonl", ".json")) or first.lstrip().startswith("{")
    out = Prompts([], [])
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"prompts_file: {path} line {number}"
        problem = _not_utf8(line)
        prompt = None
        if problem is None:
            prompt, problem = _jsonl_prompt(line) if as_jsonl else (line, None)
        if problem is not None:
            out.bad.append(f"{where}: {problem}")
            out.bad_lines.append(number)
        else:
            out.prompts.append(prompt)
            out.sources.append(where)
            out.lines.append(number)
    if not out.prompts and not out.bad:
        raise RunInputError([f"prompts_file: {path!r} holds no prompts"])
    return out


def _not_utf8(line: str) -> str | None:
    """Bytes that were not UTF-8 come back from surrogateescape as U+DC80..U+DCFF."""
    for i, c in enumerate(line):
        if 0xDC80 <= ord(c) <= 0xDCFF:
            return f"not UTF-8 text (byte 0x{ord(c) - 0xDC00:02x} at character {i})"
    return None


def _jsonl_prompt(line: str) -> tuple[Prompt | None, str | None]:
    try:
        record: Any = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg})"
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return record["prompt"], None
    ids = record.get("prompt_token_ids") if isinstance(record, dict) else None
    if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return ids, None
    return None, f'expected {{"prompt": "<text>"}} or {{"prompt_token_ids": [ints]}}, got {line[:80]}'


__all__ = ["MAX_SHOWN", "Prompt", "Prompts", "RunInputError", "read_prompts"]
