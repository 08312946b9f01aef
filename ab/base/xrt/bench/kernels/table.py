"""The kernels scenario's part of results.md: per comparison group and (model, dtype, device), a summary row
per shape (the reference, what xrt runs, the fastest) and every measurement. Later lines for the same
implementation and shape replace earlier ones."""

from __future__ import annotations

from typing import Any

from xrt.bench.markdown import md_table
from xrt.bench.results import Record

GroupKey = tuple[str, str, str, str]  # group, model, dtype, device name
Shape = tuple[str, int, int | None]  # case, rows, context


def kernel_groups(records: list[Record]) -> dict[GroupKey, list[Record]]:
    """Lines of the kernels scenario by group, the last per (shape, implementation), in measured order."""
    out: dict[GroupKey, dict[tuple[Any, ...], Record]] = {}
    for r in records:
        if r.get("scenario") == "kernels":
            key = (r["group"], r["model"], r["dtype"], r["device_name"])
            rows = out.setdefault(key, {})
            rows.pop((r["case"], r["rows"], r["context"], r["impl"]), None)
            rows[(r["case"], r["rows"], r["context"], r["impl"])] = r
    return {k: list(v.values()) for k, v in out.items()}


def shapes(rows: list[Record]) -> dict[Shape, list[Record]]:
    out: dict[Shape, list[Record]] = {}
    for r in rows:
        out.setdefault((r["case"], r["rows"], r["context"]), []).append(r)
    return out


def summary(rs: list[Record]) -> dict[str, Record | None]:
    """The baseline, default (what xrt runs) and fastest timed line of one shape."""
    timed = [r for r in rs if r["us"] is not None]

    def first(role: str) -> Record | None:
        return next((r for r in timed if r["role"] == role), None)

    return {"baseline": first("baseline"), "default": first("default"),
            "best": min((r for r in timed if r["role"] != "baseline"), key=lambda r: r["us"], default=None)}


def _us(r: Record | None) -> str:
    return "–" if r is None or r["us"] is None else f"{r['us']:.2f}"


def _ratio(a: Record | None, b: Record | None) -> str:
    return "–" if a is None or b is None else f"{a['us'] / b['us']:.2f}×"


def _gbps(r: Record | None) -> str:
    return "–" if r is None or not r.get("gbps") else f"{r['gbps']:.0f}"


def _context(c: int | None) -> str:
    return "–" if c is None else str(c)


SUMMARY = ["case", "rows", "context", "baseline", "baseline us", "xrt us", "best", "best us", "GB/s (best)",
           "baseline / xrt", "baseline / best"]
EVERY = ["case", "rows", "context", "implementation", "role", "us", "GB/s", "baseline / this", "note"]


def group_table(key: GroupKey, rows: list[Record]) -> list[str]:
    group, model, dtype, dev = key
    head = rows[0]
    summary_rows, every_rows = [], []
    for (case, n, ctx), rs in shapes(rows).items():
        s = summary(rs)
        base, default, best = s["baseline"], s["default"], s["best"]
        summary_rows.append([case, n, _context(ctx), base["impl"] if base else "–", _us(base), _us(default),
                             best["impl"] if best else "–", _us(best), _gbps(best), _ratio(base, default),
                             _ratio(base, best)])
        for r in rs:
            note = r["note"] if r["status"] == "ok" else f"{r['status'].upper()}: {r['note']}"
            ratio = _ratio(base, r) if r["us"] is not None else "–"
            every_rows.append([case, n, _context(ctx), r["impl"], r["role"], _us(r), _gbps(r), ratio, note])
    return [
        f"## Kernels: {group}, {model}, {dtype}, {dev}",
        "",
        f"torch {head['torch']}, triton {head.get('triton')}, flashinfer {head.get('flashinfer')}, commit "
        f"{head['git_commit']}; {head['timer']} median, us per call; copy bandwidth "
        f"{head.get('bandwidth_gbps') or 0:.0f} GB/s.",
        "",
        *md_table(SUMMARY, summary_rows, [c not in ("case", "baseline", "best") for c in SUMMARY]),
        "",
        *md_table(EVERY, every_rows, [c not in ("case", "implementation", "role", "note") for c in EVERY]),
    ]


NOTES = [
    "Kernels: baseline = the reference each implementation is compared to (the torch reference op, F.linear, "
    "FlashInfer as xrt's backend calls it, xrt's FlashInfer setting); xrt = what xrt runs by default; best = "
    "the fastest implementation timed; baseline / x > 1 means x is faster. Every implementation's output is "
    "checked against the reference before it is timed (WRONG / ERROR rows are not timed).",
]


def render_kernels(records: list[Record]) -> list[str]:
    groups = kernel_groups(records)
    lines: list[str] = []
    for key, rows in groups.items():
        lines += group_table(key, rows) + [""]
    return lines + NOTES if groups else []
