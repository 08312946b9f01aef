"""plot.png's rows for the serve scenario, one per table of results.md (xrt.bench.serve_table.serve_groups): mean
TTFT and TPOT (and their first percentile, and the server's own mean TTFT) against the request rate, and output
token throughput and goodput against it. Rates are categories in increasing order, all at once (0) last, as the
load they put on a server."""

from __future__ import annotations

from typing import Any

from xrt.bench.results import Record
from xrt.bench.serve_metrics import percentile_key
from xrt.bench.serve_table import rate_label


def _order(rate: float) -> float:
    return rate or float("inf")


def draw_serve(key: Any, rows: list[Record], ax_ms: Any, ax_tput: Any) -> None:
    model, input_len, output_len, _, dev = key
    rates = sorted({r["request_rate"] for r in rows}, key=_order)
    at = {rate: i for i, rate in enumerate(rates)}
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for label in labels:
        mine = sorted((r for r in rows if r["label"] == label), key=lambda r: _order(r["request_rate"]))
        xs = [at[r["request_rate"]] for r in mine]
        tag = f" {label}" if len(labels) > 1 else ""
        for metric, style in (("ttft", "o-"), ("tpot", "s-")):
            line = ax_ms.plot(xs, [r[f"mean_{metric}_ms"] for r in mine], style, label=f"mean {metric.upper()}{tag}")
            tail = percentile_key(mine[0]["percentiles"][0])
            ax_ms.plot(xs, [r[f"{tail}_{metric}_ms"] for r in mine], ":", color=line[0].get_color(),
                       label=f"{tail} {metric.upper()}{tag}")
        server = [(x, r["server_mean_ttft_ms"]) for x, r in zip(xs, mine, strict=True)
                  if r.get("server_mean_ttft_ms") is not None]
        if server:
            ax_ms.plot(*zip(*server, strict=True), "x--", label=f"server's mean TTFT{tag}")
        ax_tput.plot(xs, [r["output_throughput"] for r in mine], "o-", label=f"output tokens/s{tag}")
        if any(r["request_goodput"] is not None for r in mine):
            ax_tput.plot(xs, [r["request_goodput"] for r in mine], "^--", label=f"goodput requests/s{tag}")
    title = f"{model}, in {input_len} / out {output_len}, {dev}"
    for ax, ylabel, t in ((ax_ms, "ms", f"serve latency: {title}"), (ax_tput, "per second", f"serve throughput: "
                                                                                               f"{title}")):
        ax.set_xticks(range(len(rates)), [rate_label(r) for r in rates])
        ax.set_xlabel("request rate")
        ax.set_ylabel(ylabel)
        ax.set_title(t, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
