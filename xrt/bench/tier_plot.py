"""plot.png's rows for the KV-tier scenarios. Prefix: TTFT by where the prefix comes from against the prefix
length (ms, log), and the same as a fraction of cold. Multiturn: requests/s per cache.tiers setting, and the
prompt tokens each tier served (stacked) beside those computed."""

from __future__ import annotations

from typing import Any

from xrt.bench.cells import label_order
from xrt.bench.figure import style_axes
from xrt.bench.results import Record
from xrt.bench.tier_table import PREFIX_PHASES, multiturn_groups, prefix_groups

SOURCES = (("gpu", "GPU"), ("l1", "L1"), ("l2", "L2"))


def tier_rows(records: list[Record]) -> list[tuple[str, Any, list[Record]]]:
    """(scenario, group key, rows) for each plot row these records give."""
    return [("prefix", k, v) for k, v in prefix_groups(records).items()] + [
        ("multiturn", k, v) for k, v in multiturn_groups(records).items()
    ]


def draw_prefix(key: Any, rows: list[Record], ax_ms: Any, ax_frac: Any) -> None:
    model, dtype, dev = key
    lens = sorted({r["prefix_len"] for r in rows})
    for label in sorted({r["label"] for r in rows}, key=label_order):
        mine = sorted((r for r in rows if r["label"] == label), key=lambda r: r["prefix_len"])
        many = len({r["label"] for r in rows}) > 1
        for phase, name in PREFIX_PHASES:
            pts = [
                (r["prefix_len"], r[f"{phase}_ttft_ms"], r.get(f"{phase}_ttft_frac"))
                for r in mine
                if r.get(f"{phase}_ttft_ms") is not None
            ]
            if not pts:
                continue
            tag = f"{name} {label}" if many else name
            ax_ms.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=tag)
            fr = [(p[0], p[2]) for p in pts if p[2] is not None]
            ax_frac.plot([p[0] for p in fr], [p[1] for p in fr], "o-", label=tag)
    values = [r[f"{p}_ttft_ms"] for r in rows for p, _ in PREFIX_PHASES if r.get(f"{p}_ttft_ms")]
    if values and max(values) > 20 * min(values):  # log where the sources differ by orders of magnitude
        ax_ms.set_yscale("log")
    ax_frac.axhline(1.0, color="k", lw=0.6)
    style_axes(ax_ms, lens, "prefix tokens", "TTFT ms", f"TTFT by prefix source: {model}, {dtype}, {dev}")
    style_axes(ax_frac, lens, "prefix tokens", "TTFT / cold (gpu)", f"TTFT as a fraction of cold: {model}")


def draw_multiturn(key: Any, rows: list[Record], ax_rate: Any, ax_tokens: Any) -> None:
    model, clients, rounds, turn_len, output_len, dtype, dev = key
    names = [r["tiers"] if r["label"] == rows[0]["label"] else f"{r['tiers']} {r['label']}" for r in rows]
    xs = list(range(len(rows)))
    bars = ax_rate.bar(xs, [r["requests_per_s"] for r in rows], color="tab:blue")
    ax_rate.bar_label(bars, [f"{r['requests_per_s_ratio']:.2f}×" for r in rows], fontsize=8)
    bottom = [0.0] * len(rows)
    for tier, name in (*SOURCES, ("computed", "computed")):
        vals = [
            float(r["computed_prompt_tokens"] if tier == "computed" else (r.get("cached_tokens") or {}).get(tier, 0))
            for r in rows
        ]
        ax_tokens.bar(xs, vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    title = f"{model}: {clients} clients x {rounds} rounds, turn {turn_len}, out {output_len}, {dtype}, {dev}"
    for ax, ylabel, t in (
        (ax_rate, "requests/s", f"throughput, {title}"),
        (ax_tokens, "prompt tokens", "prompt tokens by the tier serving their KV"),
    ):
        ax.set_xticks(xs, names)
        ax.set_xlabel("cache.tiers")
        ax.set_ylabel(ylabel)
        ax.set_title(t, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    ax_tokens.legend(fontsize=8)


def draw(scenario: str, key: Any, rows: list[Record], axes: Any) -> None:
    (draw_prefix if scenario == "prefix" else draw_multiturn)(key, rows, *axes)
