"""What every bench plot shares: a grid of axes, log2 batch axes with the measured values as ticks, saving.
matplotlib is imported here, on first use (the GPU machine has none: xrt.bench.report says so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def new_figure(rows: int, cols: int, width: float) -> tuple[Any, Any]:
    """(figure, axes[rows][cols]), 4.5 inches per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=(width, 4.5 * rows), squeeze=False)


def style_axes(ax: Any, ticks: list[int], xlabel: str, ylabel: str, title: str, legend_size: int = 8) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())  # the measured batches are the x ticks; y keeps its minor ticks
    if ax.get_yscale() == "log":
        label_log_y(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend_size)


def label_log_y(ax: Any) -> None:
    """A log y axis with plain-number labels (`2`, `5`, `20`, `0.5`) at 1-9 x each power of ten: matplotlib's
    default labels only powers of ten, so a TTFT axis spanning 2-9 ms had no label at all. Minor ticks are
    labelled while the axis spans little (LogFormatter's minor_thresholds: all of them under 0.6 decades, 2 and 5
    under 2.5), so a wide axis is not crowded."""
    from matplotlib.ticker import LogFormatter, LogLocator

    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(2, 10))))
    ax.yaxis.set_major_formatter(LogFormatter(base=10, labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(LogFormatter(base=10, labelOnlyBase=False, minor_thresholds=(2.5, 0.6)))


def save_figure(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
