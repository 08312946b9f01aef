"""The throughput scenario in several processes (`bench.invocations`), one after another: each a fresh
interpreter, CUDA context, allocator and set of captured graphs, as separate runs of `xrt bench` are, so the record
shows the spread between invocations of one code beside the spread of the timed runs within one. Each process is
`python -m xrt.bench.invocations` with the config as JSON on stdin and its records as JSON on stdout (its progress
on stderr); the record kept is the first one's, its figures the median over the invocations, with each one's."""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any

import attrs

from xrt.bench.child import run_child
from xrt.bench.engine_timing import Progress
from xrt.bench.results import Record
from xrt.bench.setup import BenchError
from xrt.config import XrtConfig
from xrt.reflect import build, to_dict


def run_invocations(cfg: XrtConfig, progress: Progress) -> list[Record]:
    n = cfg.bench.invocations
    one = attrs.evolve(cfg, bench=attrs.evolve(cfg.bench, invocations=1))
    spec = {"config": to_dict(one), "given": to_dict(cfg)}
    runs: list[Record] = []
    for i in range(n):
        progress(f"[bench] throughput invocation {i + 1}/{n}: a new process")
        runs.append(_invoke(spec))
        progress(f"[bench] throughput invocation {i + 1}/{n}: {runs[-1]['tokens_per_s']:.0f} tokens/s")
    return [combine(runs)]


def combine(runs: list[Record]) -> Record:
    """The first invocation's record with the median tokens/s and wall time over all of them, each one's, and the
    spread: (max - min) / median of tokens/s."""
    tps = [r["tokens_per_s"] for r in runs]
    median = statistics.median(tps)
    wall = statistics.median(r["wall_s"] for r in runs)
    rec = dict(runs[0])
    rec.update(
        invocations=len(runs),
        wall_s=wall,
        wall_s_all=[w for r in runs for w in r["wall_s_all"]],
        tokens_per_s=(rec["input_tokens"] + rec["output_tokens"]) / wall,
        output_tokens_per_s=rec["output_tokens"] / wall,
        tokens_per_s_invocations=tps,
        invocation_pids=[r["pid"] for r in runs],
        tokens_per_s_spread=(max(tps) - min(tps)) / median,
    )
    return rec


def _invoke(spec: dict[str, Any]) -> Record:
    out = run_child("xrt.bench.invocations", spec, "bench.invocations: an invocation")
    if "error" in out:
        raise BenchError(out["error"])
    return out["record"]


def main() -> int:
    from xrt.bench.throughput import run_throughput

    spec = json.load(sys.stdin)
    cfg = build(XrtConfig, spec["config"])
    try:
        records = run_throughput(cfg, lambda line: print(line, file=sys.stderr, flush=True))
    except BenchError as e:
        json.dump({"error": str(e)}, sys.stdout)
        return 0
    rec = {**records[0], "pid": os.getpid(), "config": spec["given"]}
    json.dump({"record": rec}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
