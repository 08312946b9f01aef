"""A sweep's results. Each bench job of a multirun writes its own results.jsonl in its Hydra job directory
(<sweep dir>/<job number>/, beside Hydra's .hydra/config.yaml and overrides.yaml), its lines tagged with the job
and the objective it returned; `job_dirs` finds them, and `xrt.bench.report.combine` joins them into
<sweep dir>/results.jsonl and regenerates the table and plots there. It reads only files, so it serves a sweep
whose jobs ran on other machines (submitit on a cluster, or job directories copied together):
`python -m xrt bench report DIR`."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from xrt.bench.results import RESULTS, Record, read_records
from xrt.bench.serve_metrics import objective_key
from xrt.config import BenchObjective
from xrt.config.bench import THROUGHPUT_OBJECTIVES

# A sweep job's result lines carry {"job": number, "overrides": [...], "objective": name, "value": float}.
SWEEP_KEY = "sweep"


def direction(metric: BenchObjective) -> str:
    """Optuna's name for the way this metric improves."""
    return "maximize" if metric in THROUGHPUT_OBJECTIVES else "minimize"


def objective_value(records: list[Record], metric: BenchObjective) -> float:
    """The job's objective: throughput as measured; TTFT/TPOT the mean over the batches measured (serve: the mean over
    its requests, under vLLM's key, `objective_key`). NaN when
    nothing was (every batch skipped): the sweeper records a failed trial rather than a made-up value."""
    values = [r[k] for r in records if r.get("status") == "ok" and r.get(k := objective_key(r, metric)) is not None]
    return sum(values) / len(values) if values else math.nan


def job_dirs(root: Path) -> list[Path]:
    """Directories under `root` holding a sweep job's results.jsonl (its lines carry `SWEEP_KEY`, or Hydra's
    .hydra/ is beside it), in job order (numbers compared as numbers). Other results directories below (a
    single run's) are not a sweep's jobs, nor is one holding jobs below it (a sweep copied into a larger one:
    its combined lines)."""
    found = {p.parent for p in root.rglob(RESULTS) if p.parent != root and _is_job(p.parent)}
    jobs = [d for d in found if not any(d in o.parents for o in found)]
    return sorted(jobs, key=lambda d: _natural(d.relative_to(root)))


def own_lines(root: Path) -> bool:
    """<root>/results.jsonl holds lines that are not its jobs' (a single run's): combining would lose them."""
    return any(SWEEP_KEY not in r for r in read_records(root))


def best_lines(records: list[Record]) -> list[str]:
    """The best job per objective, as its sweep job lines recorded it."""
    jobs: dict[Any, dict[str, Any]] = {}
    for r in records:
        info = r.get(SWEEP_KEY)
        if isinstance(info, dict) and info.get("objective") and isinstance(info.get("value"), (int, float)):
            jobs[(info["objective"], info.get("job"), tuple(info.get("overrides") or ()))] = info
    # Only what tells the jobs apart: the overrides every job has add nothing to the line.
    common = set.intersection(*(set(i.get("overrides") or ()) for i in jobs.values())) if len(jobs) > 1 else set()
    out = []
    for name in sorted({info["objective"] for info in jobs.values()}):
        scored = [i for i in jobs.values() if i["objective"] == name and not math.isnan(i["value"])]
        if not scored:
            continue
        pick = max if direction(BenchObjective(name)) == "maximize" else min
        best = pick(scored, key=lambda i: i["value"])
        label = " ".join(o for o in best.get("overrides") or [] if o not in common) or "(defaults)"
        # Hydra's job number, as its launch lines print it (`#2 : ...`) and its job directory is named.
        out.append(f"best {name}: {best['value']:.4g} (job #{best.get('job')}: {label})")
    return out


def _is_job(directory: Path) -> bool:
    if (directory / ".hydra").is_dir():
        return True
    with (directory / RESULTS).open() as f:
        first = f.readline()
    return bool(first.strip()) and SWEEP_KEY in json.loads(first)


def _natural(path: Path) -> list[tuple[int, Any]]:
    return [(0, int(t)) if t.isdigit() else (1, t) for part in path.parts for t in re.split(r"(\d+)", part) if t]


__all__ = ["SWEEP_KEY", "best_lines", "direction", "job_dirs", "objective_value", "own_lines"]
