"""`python -m xrt bench`: run the configured scenario (latency, throughput, kernels, prefix, multiturn, serve), write
its lines to <bench.out_dir>/results.jsonl, and regenerate results.md and the plots there. In a multirun (`-m`) each job
writes into its Hydra job directory and the sweep's table is built from them all (`xrt.bench.sweep_results`);
`python -m xrt bench report DIR` rebuilds it from any finished sweep (or results) directory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from xrt.config import BenchScenario, XrtConfig

if TYPE_CHECKING:
    from xrt.bench.peer_cache import PeerCache
    from xrt.bench.results import Record
    from xrt.cli.multirun import SweepJob


def main(cfg: XrtConfig) -> int:
    """One run: results.jsonl in bench.out_dir starts afresh."""
    rc, _ = run_job(cfg)
    return rc


def sweep_job(cfg: XrtConfig, job: SweepJob) -> tuple[int, float | None]:
    """One job of a multirun: its results in its job directory, the peer's figures shared through the sweep
    directory. Returns the exit status and the objective (`bench.objective`) for the sweeper."""
    from xrt.bench.peer_cache import PEER_CACHE, PeerCache
    from xrt.bench.sweep_results import objective_value

    # The job's directory, so jobs running side by side never share a results.jsonl.
    cfg = attrs.evolve(cfg, bench=attrs.evolve(cfg.bench, out_dir=str(job.job_dir)))
    total = f" of {job.num_jobs}" if job.num_jobs else ""
    rc, records = run_job(cfg, label=f"job #{job.num}{total}", peers=PeerCache(job.sweep_dir / PEER_CACHE),
                          sweep={"job": job.num, "overrides": job.overrides})
    metric = cfg.bench.objective_metric()
    return rc, objective_value(objective_records(cfg, records), metric) if metric is not None and rc == 0 else None


def objective_records(cfg: XrtConfig, records: list[Record]) -> list[Record]:
    """The lines the objective is taken from: multiturn's is the last bench.compare_tiers setting's (the others
    are its baselines); every scenario else averages its lines (xrt.bench.sweep_results.objective_value)."""
    if cfg.bench.scenario is BenchScenario.MULTITURN and cfg.bench.compare_tiers:
        last = cfg.bench.compare_tiers[-1].value
        return [r for r in records if r.get("tiers") == last]
    return records


def run_job(
    cfg: XrtConfig, label: str = "", peers: PeerCache | None = None, sweep: dict[str, Any] | None = None
) -> tuple[int, list[Record]]:
    """Measure, write results.jsonl; the table and plots too for a single run (a sweep's are built at its end).
    `peers`: the sweep's peer figures; `sweep`: the job's entry for every line (`SWEEP_KEY`), objective added."""
    from xrt.bench.report import regenerate
    from xrt.bench.results import write_records
    from xrt.bench.setup import BenchError, cpu_warning
    from xrt.bench.sweep_results import SWEEP_KEY, objective_value
    from xrt.cli.paths import out_dir_problems
    from xrt.executor.device import resolve_device
    from xrt.log import get_logger

    def progress(line: str) -> None:
        print(line, flush=True)

    # The CLI checks every job's out_dir before the first measures; this covers direct callers.
    for path, message in out_dir_problems(cfg):
        print(f"error: {path}: {message}", file=sys.stderr)
        return 2, []
    out_dir = Path(cfg.bench.out_dir)
    warning = cpu_warning(cfg, resolve_device(cfg).type)
    if warning:
        get_logger(__name__).warning(warning)
    try:
        if cfg.bench.scenario is BenchScenario.LATENCY:
            from xrt.bench.latency import run_latency

            records = run_latency(cfg, progress, peers=peers)
        elif cfg.bench.scenario is BenchScenario.THROUGHPUT and cfg.bench.invocations > 1:
            from xrt.bench.invocations import run_invocations

            records = run_invocations(cfg, progress)
        elif cfg.bench.scenario is BenchScenario.THROUGHPUT:
            from xrt.bench.throughput import run_throughput

            records = run_throughput(cfg, progress)
        elif cfg.bench.scenario is BenchScenario.PREFIX:
            from xrt.bench.prefix import run_prefix

            records = run_prefix(cfg, progress)
        elif cfg.bench.scenario is BenchScenario.MULTITURN:
            from xrt.bench.multiturn import run_multiturn

            records = run_multiturn(cfg, progress)
        elif cfg.bench.scenario is BenchScenario.SERVE:
            from xrt.bench.serve import run_serve

            records = run_serve(cfg, progress)
        else:
            from xrt.bench.kernels.run import run_kernels

            records = run_kernels(cfg, progress)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2, []
    if sweep is not None:
        metric = cfg.bench.objective_metric()
        if metric is not None:
            sweep = {**sweep, "objective": metric.value,
                     "value": objective_value(objective_records(cfg, records), metric)}
        records = [{**r, SWEEP_KEY: sweep} for r in records]
    results = write_records(out_dir, records, fresh=True)
    lines = [f"wrote {results}", *([] if sweep is not None else regenerate(out_dir))]
    for line in lines:
        progress(f"[bench] {label + ': ' if label else ''}{line}")
    return 0, records
