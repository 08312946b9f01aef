"""plot.png: TPOT and TTFT against batch for each latency group: ours per executor (and swept field), the HF peer,
xLLM's H100 figures (when the lengths match theirs) and the bandwidth floor; below them a row per group of the
KV-tier scenarios (prefix, multiturn: xrt.bench.tier_plot) and of the serve scenario (xrt.bench.serve_plot)."""

from __future__ import annotations

from pathlib import Path

from xrt.bench.anchors import XLLM_INPUT_LEN, XLLM_OUTPUT_LEN, load_xllm
from xrt.bench.cells import label_order
from xrt.bench.figure import new_figure, save_figure, style_axes
from xrt.bench.results import Record
from xrt.bench.table import latency_groups


def _series(rows: list[Record], field: str) -> tuple[list[int], list[float]]:
    pts = sorted((r["batch"], r[field]) for r in rows if r["status"] == "ok" and r.get(field) is not None)
    return [b for b, _ in pts], [v for _, v in pts]


def write_plot(records: list[Record], path: Path) -> bool:
    """False when there is nothing to plot (no successful latency, prefix, multiturn or serve line)."""
    from xrt.bench.serve_plot import draw_serve
    from xrt.bench.serve_table import serve_groups
    from xrt.bench.tier_plot import draw, tier_rows

    groups = {k: v for k, v in latency_groups(records).items() if any(r["status"] == "ok" for r in v)}
    tiers = tier_rows(records)
    serve = serve_groups(records)
    if not groups and not tiers and not serve:
        return False
    fig, axes = new_figure(len(groups) + len(tiers) + len(serve), 2, 12)
    for (scenario, key, rows), pair in zip(tiers, axes[len(groups) : len(groups) + len(tiers)], strict=True):
        draw(scenario, key, rows, pair)
    for (key, rows), pair in zip(serve.items(), axes[len(groups) + len(tiers) :], strict=True):
        draw_serve(key, rows, *pair)
    for (key, rows), (ax_tpot, ax_ttft) in zip(groups.items(), axes[: len(groups)], strict=True):
        model, input_len, output_len, dtype, dev = key
        xllm = load_xllm() if (input_len, output_len) == (XLLM_INPUT_LEN, XLLM_OUTPUT_LEN) else {}
        xb = sorted(xllm)
        for ax, metric in ((ax_tpot, "tpot"), (ax_ttft, "ttft")):
            for label in sorted({r["label"] for r in rows}, key=label_order):
                mine = [r for r in rows if r["label"] == label]
                ax.plot(*_series(mine, f"{metric}_ms"), "o-", label=f"xrt {label}")
            # One line per peer (a sweep over bench.peer, or bench.peer=both, has both beside one xrt line).
            for kind, name in (("hf", "HF transformers"), ("compile", "HF transformers, compiled")):
                peer_rows = {r["batch"]: r for r in rows
                             if r.get("peer") == kind and r.get(f"peer_{metric}_ms") is not None}
                if peer_rows:
                    ax.plot(*_series(list(peer_rows.values()), f"peer_{metric}_ms"), "s--" if kind == "hf" else "^--",
                            label=name)
            for col in ("py_graph", "cpp_graph"):
                if xb:
                    ax.plot(xb, [xllm[b][f"{col}_{metric}"] for b in xb], ":", label=f"xLLM {col} (H100)")
            if metric == "tpot":
                floor = {r["batch"]: r for r in rows if r.get("floor_ms") is not None}
                if floor:
                    ax.plot(*_series(list(floor.values()), "floor_ms"), "k-", lw=0.8, label="bandwidth floor")
            ax.set_yscale("log")
            ticks = sorted({r["batch"] for r in rows} | set(xb))
            title = f"{metric.upper()}: {model}, in {input_len} / out {output_len}, {dtype}, {dev}"
            style_axes(ax, ticks, "batch", f"{metric.upper()} ms", title)
    save_figure(fig, path)
    return True
