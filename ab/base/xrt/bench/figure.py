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
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=legend_size)


def save_figure(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
