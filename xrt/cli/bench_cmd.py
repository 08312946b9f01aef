"""`python -m xrt bench`: run the configured scenario (latency, throughput, kernels), append its lines to
<bench.out_dir>/results.jsonl, and regenerate results.md and the plots from every line there. The jobs of a
sweep that share an out_dir make one table; the first of them there starts results.jsonl afresh."""

from __future__ import annotations

import sys
from pathlib import Path

from xrt.config import BenchScenario, XrtConfig


def main(cfg: XrtConfig, job: int = 0, num_jobs: int = 1, fresh: bool | None = None) -> int:
    """One job of a (multi)run. `fresh` (default: job 0) starts results.jsonl afresh; otherwise the job
    appends to it and reuses the peer figures earlier jobs of the sweep wrote there."""
    from xrt.bench.report import regenerate
    from xrt.bench.results import read_records, write_records
    from xrt.bench.setup import BenchError, cpu_warning
    from xrt.cli.paths import out_dir_problems
    from xrt.executor.device import resolve_device
    from xrt.log import get_logger

    def progress(line: str) -> None:
        print(line, flush=True)

    fresh = job == 0 if fresh is None else fresh
    # The CLI checks every job's out_dir before the first measures; this covers direct callers.
    for path, message in out_dir_problems(cfg):
        print(f"error: {path}: {message}", file=sys.stderr)
        return 2
    out_dir = Path(cfg.bench.out_dir)
    warning = cpu_warning(cfg, resolve_device(cfg).type)
    if warning:
        get_logger(__name__).warning(warning)
    try:
        if cfg.bench.scenario is BenchScenario.LATENCY:
            from xrt.bench.latency import run_latency

            records = run_latency(cfg, progress, earlier=None if fresh else read_records(out_dir))
        elif cfg.bench.scenario is BenchScenario.THROUGHPUT:
            from xrt.bench.throughput import run_throughput

            records = run_throughput(cfg, progress)
        else:
            from xrt.bench.kernels.run import run_kernels

            records = run_kernels(cfg, progress)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results = write_records(out_dir, records, fresh=fresh)
    for line in [f"wrote {results}", *regenerate(out_dir)]:
        progress(f"[bench] job {job + 1}/{num_jobs}: {line}")
    return 0
