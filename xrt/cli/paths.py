"""Where a command writes, checked before anything is loaded or measured, so bad paths fail in a second and
never after minutes of work; and the per-job paths of a sweep, so its jobs never overwrite each other."""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs

from xrt.config import XrtConfig
from xrt.reflect import Problem


def input_path(path: str) -> str:
    """A path field as the user wrote it, `~` expanded (many shells leave `output=~/o.jsonl` alone), as
    `model.path` and `cache.l2.path` are."""
    return os.path.expanduser(path)


def output_problems(cfg: XrtConfig) -> list[Problem]:
    """`run`'s `output`: a file (not a directory) in an existing, writable directory, not the prompts, not an
    earlier file unless output_overwrite=true, and one the kernel really lets us create."""
    path = input_path(cfg.output)
    if not path:
        return []
    if "\0" in path:
        return [("output", f"must not contain a NUL character, got {path!r}")]
    if os.path.isdir(path):
        return [("output", f"{path!r} is a directory; expected a file path such as {os.path.join(path, 'out.jsonl')}")]
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        return [("output", f"directory {parent!r} does not exist; create it or choose another path")]
    if not os.path.isdir(parent):
        return [("output", f"{parent!r} is not a directory, so {path!r} cannot be written")]
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return [("output", f"cannot write {path!r} (permission denied)")]
    if cfg.prompts_file and "\0" not in cfg.prompts_file and _same_file(path, input_path(cfg.prompts_file)):
        return [("output", f"{path!r} is the prompts_file; writing there would overwrite the prompts")]
    if os.path.isfile(path) and not cfg.output_overwrite:
        return [("output", f"{path!r} exists; choose another path, or set output_overwrite=true to replace it")]
    problem = _try_create(path)
    return [("output", problem)] if problem else []


def _try_create(path: str) -> str | None:
    """Whether `path` can really be opened for writing: os.access passes paths the kernel refuses later
    (/proc/x, a read-only mount, a full quota). A new file is made and removed again; an existing one is opened
    for appending, which changes nothing; a fifo or device (/dev/stdout) is left alone (opening may block)."""
    exists = os.path.exists(path)
    if exists and not os.path.isfile(path):
        return None
    try:
        with open(path, "a" if exists else "x", encoding="utf-8"):
            pass
        if not exists:
            os.remove(path)
    except OSError as e:
        return f"cannot write {path!r} ({e.strerror or e})"
    return None


def out_dir_problems(cfg: XrtConfig) -> list[Problem]:
    """`bench`'s `bench.out_dir`: a directory, or one that can be made (its nearest existing ancestor is a
    writable directory)."""
    path = cfg.bench.out_dir
    if not path or "\0" in path:
        return [("bench.out_dir", f"must name a directory (no NUL characters), got {path!r}")]
    if os.path.exists(path) and not os.path.isdir(path):
        return [("bench.out_dir", f"{path!r} is a file; expected a directory (results.jsonl and the table go there)")]
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return [("bench.out_dir", f"{ancestor!r} is a file, so {path!r} cannot be made")]
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return [("bench.out_dir", f"cannot write in {ancestor!r} (permission denied)")]
    results = os.path.join(path, "results.jsonl")
    if os.path.isdir(results):
        return [("bench.out_dir", f"{results!r} is a directory; expected results.jsonl to be a file")]
    return []


def sweep_dir_problems(path: str) -> list[Problem]:
    """A multirun's `hydra.sweep.dir`: a directory that can be made, and not one holding an earlier sweep's job
    directories (their results would join this sweep's table; Hydra itself would overwrite them job by job)."""
    key = "hydra.sweep.dir"
    if not path or "\0" in path:
        return [(key, f"must name a directory (no NUL characters), got {path!r}")]
    if os.path.exists(path) and not os.path.isdir(path):
        return [(key, f"{path!r} is a file; expected a directory (each job's results go in it)")]
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return [(key, f"{ancestor!r} is a file, so {path!r} cannot be made")]
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return [(key, f"cannot write in {ancestor!r} (permission denied)")]
    if os.path.isdir(path):
        earlier = sorted(e.name for e in os.scandir(path) if e.is_dir() and _is_job_dir(e.path))
        if earlier:
            return [(key, f"{path!r} holds an earlier sweep's jobs ({', '.join(earlier[:3])}"
                          f"{', ...' if len(earlier) > 3 else ''}); choose another directory or remove them")]
    return []


def _is_job_dir(path: str) -> bool:
    return os.path.isdir(os.path.join(path, ".hydra")) or os.path.isfile(os.path.join(path, "results.jsonl"))


def prompts_file_problems(cfg: XrtConfig) -> list[Problem]:
    """`run`'s `prompts_file`, when set: a file that exists (its lines are checked by xrt.cli.run_prompts)."""
    path = input_path(cfg.prompts_file)
    if not path or "\0" in path:
        return [] if not path else [("prompts_file", f"must not contain a NUL character, got {path!r}")]
    if os.path.isdir(path):
        return [("prompts_file", f"{path!r} is a directory; expected a JSONL or text file")]
    if not os.path.isfile(path):
        return [("prompts_file", f"no such file {path!r}")]
    return []


def run_problems(cfg: XrtConfig) -> list[Problem]:
    return prompts_file_problems(cfg) + output_problems(cfg)


CHECKS: dict[str, Callable[[XrtConfig], list[Problem]]] = {"run": run_problems, "bench": out_dir_problems}


def separate_outputs(cfgs: list[XrtConfig]) -> list[XrtConfig]:
    """Jobs of a sweep that would all write one `output` file each get their own, numbered by Hydra's job
    number (job.num, from 0, as `[HYDRA] #0` and every job mark print it): o.jsonl -> o.0.jsonl, o.1.jsonl
    (zero-padded past 10 jobs). Jobs whose outputs already
    differ (`-m output=a.jsonl,b.jsonl`) keep them. (A bench sweep's jobs write under hydra.sweep.dir.)"""
    by_path: dict[str, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        if cfg.output:
            by_path.setdefault(os.path.abspath(input_path(cfg.output)), []).append(i)
    width = len(str(max(len(cfgs) - 1, 0)))
    out = list(cfgs)
    for ids in by_path.values():
        if len(ids) > 1:
            for i in ids:
                out[i] = attrs.evolve(cfgs[i], output=numbered(cfgs[i].output, i, width))
    return out


def numbered(path: str, number: int, width: int = 1) -> str:
    head, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    return os.path.join(head, f"{stem}.{number:0{width}d}{ext}")


def sweep_problems(cfgs: list[XrtConfig]) -> list[list[Problem]]:
    """Per job: its output is another job's output too, or another job's prompts_file."""
    found: list[list[Problem]] = [[] for _ in cfgs]
    outputs = [os.path.abspath(input_path(c.output)) if c.output else "" for c in cfgs]
    prompts = [os.path.abspath(input_path(c.prompts_file)) if c.prompts_file else "" for c in cfgs]
    for i, path in enumerate(outputs):
        if not path:
            continue
        earlier = next((j for j in range(i) if outputs[j] == path), None)
        if earlier is not None:  # reported once, on the later job
            found[i].append(("output", f"{cfgs[i].output!r} is written by job #{earlier} too"))
        readers = [f"#{j}" for j, p in enumerate(prompts) if p == path and j != i]
        if readers:
            found[i].append(("output", f"{cfgs[i].output!r} is the prompts_file of job {', '.join(readers)}"))
    return found


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


__all__ = [
    "CHECKS", "input_path", "numbered", "out_dir_problems", "output_problems", "prompts_file_problems", "run_problems",
    "separate_outputs", "sweep_dir_problems", "sweep_problems",
]
