"""results.md and plot.png from every line of results.jsonl. Also a command, for results brought
back from a machine without matplotlib: `python -m xrt.bench.report <out_dir>`."""

from __future__ import annotations

import sys
from pathlib import Path

from xrt.bench.results import PLOT, TABLE, read_records
from xrt.bench.table import render_markdown


def regenerate(out_dir: Path) -> list[str]:
    """Writes the table and the plot; returns one line per file written or left out."""
    records = read_records(out_dir)
    (out_dir / TABLE).write_text(render_markdown(records))
    done = [f"wrote {out_dir / TABLE}"]
    try:
        from xrt.bench.plot import write_plot

        plotted = write_plot(records, out_dir / PLOT)
    except ImportError as e:
        (out_dir / PLOT).unlink(missing_ok=True)
        return [*done, f"{PLOT} left out: {e.name or 'matplotlib'} is not installed here; "
                       f"run `python -m xrt.bench.report {out_dir}` where it is"]
    if plotted:
        return [*done, f"wrote {out_dir / PLOT}"]
    (out_dir / PLOT).unlink(missing_ok=True)
    return [*done, f"{PLOT} left out: no latency measurement to plot"]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "results.jsonl").is_file():
        print("usage: python -m xrt.bench.report <out_dir>  (a directory holding results.jsonl)", file=sys.stderr)
        return 2
    for line in regenerate(Path(argv[0])):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
