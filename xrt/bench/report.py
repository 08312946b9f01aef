"""results.md, plot.png and kernels.png from every line of results.jsonl. Also a command, for results brought
back from a machine without matplotlib or a sweep whose jobs ran elsewhere: `python -m xrt bench report DIR`
(or `python -m xrt.bench.report DIR`); DIR holding job directories is a sweep's (`xrt.bench.sweep_results`), whose
lines `combine` joins first."""

from __future__ import annotations

import sys
from pathlib import Path

from xrt.bench.results import KERNELS_PLOT, PLOT, RESULTS, TABLE, read_records, write_records
from xrt.bench.sweep_results import best_lines, job_dirs, own_lines
from xrt.bench.table import render_markdown


def regenerate(out_dir: Path) -> list[str]:
    """Writes the table and the plots; returns one line per file written or left out."""
    records = read_records(out_dir)
    (out_dir / TABLE).write_text(render_markdown(records))
    done = [f"wrote {out_dir / TABLE}"]
    try:
        from xrt.bench.kernels.plot import write_kernels_plot
        from xrt.bench.plot import write_plot

        plots = [(PLOT, write_plot), (KERNELS_PLOT, write_kernels_plot)]
        plotted = [name for name, write in plots if write(records, out_dir / name)]
    except ImportError as e:
        plotted = []
        reason = (f"{e.name or 'matplotlib'} is not installed here; "
                  f"run `python -m xrt.bench.report {out_dir}` where it is")
    else:
        reason = "no latency, KV-tier, serve or kernels measurement to plot"
    for name in (PLOT, KERNELS_PLOT):
        if name not in plotted:
            (out_dir / name).unlink(missing_ok=True)
    if not plotted:
        return [*done, f"{PLOT} left out: {reason}"]
    return [*done, *(f"wrote {out_dir / name}" for name in plotted)]


def combine(root: Path) -> list[str]:
    """<root>/results.jsonl from every sweep job's lines (`job_dirs`), then the table and plots; the lines to
    print."""
    dirs = job_dirs(root)
    records = [r for d in dirs for r in read_records(d)]
    path = write_records(root, records, fresh=True)
    return [f"wrote {path} ({len(records)} lines from {len(dirs)} jobs)", *regenerate(root), *best_lines(records)]


USAGE = "usage: python -m xrt bench report DIR  (a bench.out_dir or sweep directory: results.jsonl in it or its jobs)"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"error: expected one directory, got {len(argv)} arguments\n{USAGE}", file=sys.stderr)
        return 2
    root = Path(argv[0])
    if root.is_dir() and job_dirs(root):
        if own_lines(root):
            print(f"error: {root / RESULTS}: holds lines of its own besides the sweep jobs below it; "
                  f"report a directory that holds only the sweep", file=sys.stderr)
            return 2
        lines = combine(root)
    elif (root / RESULTS).is_file():
        lines = regenerate(root)
    else:
        print(f"error: {root}: no {RESULTS} in it or in a job directory below it\n{USAGE}", file=sys.stderr)
        return 2
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
