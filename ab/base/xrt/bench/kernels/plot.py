"""kernels.png: per comparison group, how many times faster than its baseline what xrt runs is (solid) and the
fastest implementation timed (dotted), against rows (tokens or batch), one line per case and context."""

from __future__ import annotations

from pathlib import Path

from xrt.bench.figure import new_figure, save_figure, style_axes
from xrt.bench.kernels.table import kernel_groups, shapes, summary
from xrt.bench.results import Record


def speedups(rows: list[Record], role: str) -> dict[str, tuple[list[int], list[float]]]:
    """label (case, context) -> (rows, baseline us / `role` us) over the shapes where both were timed."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for (case, n, ctx), rs in shapes(rows).items():
        s = summary(rs)
        base, other = s["baseline"], s[role]
        if base is None or other is None:
            continue
        xs, ys = out.setdefault(case if ctx is None else f"{case}, context {ctx}", ([], []))
        xs.append(n)
        ys.append(base["us"] / other["us"])
    return {k: (sorted(xs), [y for _, y in sorted(zip(xs, ys, strict=True))]) for k, (xs, ys) in out.items()}


def write_kernels_plot(records: list[Record], path: Path) -> bool:
    """False when there is nothing to plot (no kernels line with a timed baseline)."""
    groups = {k: v for k, v in kernel_groups(records).items() if speedups(v, "best") or speedups(v, "default")}
    if not groups:
        return False
    import matplotlib.pyplot as plt

    fig, axes = new_figure(len(groups), 1, 9)
    for ((group, model, dtype, dev), rows), (ax,) in zip(groups.items(), axes, strict=True):
        colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4)
        best = speedups(rows, "best")
        default = speedups(rows, "default")
        for label in sorted(set(best) | set(default)):
            color = next(colors)
            if label in default:
                ax.plot(*default[label], "o-", color=color, label=f"{label}: xrt")
            if label in best:
                ax.plot(*best[label], "x:", color=color, label=f"{label}: best")
        ax.axhline(1.0, color="k", lw=0.8)
        style_axes(ax, sorted({r["rows"] for r in rows}), "rows (tokens or batch)", "baseline time / time",
                   f"{group}: {model}, {dtype}, {dev}", legend_size=7)
    save_figure(fig, path)
    return True
