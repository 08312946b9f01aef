"""What results.md's tables share (xrt.bench.table's latency and throughput tables, xrt.bench.tier_table's prefix
and multiturn ones): row labels from the fields a sweep varies, and the millisecond cells."""

from __future__ import annotations

from typing import Any

from xrt.bench.results import Record

# Config fields that differ between jobs without making a different row: the batch and the serve scenario's
# request rate (a row's own column), the executor (the label's head) and where the results go.
SAME_ROW = {"bench.batch", "bench.request_rate", "bench.out_dir", "executor.kind"}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def row_labels(records: list[Record]) -> list[str]:
    """executor, plus the config fields that vary between the group's lines (a sweep over them)."""
    flats = [flatten(r.get("config") or {}) for r in records]
    keys = sorted({k for f in flats for k in f} - SAME_ROW)
    varying = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1]
    return [
        r["executor"] + (" " + " ".join(f"{k}={f.get(k)}" for k in varying) if varying else "")
        for r, f in zip(records, flats, strict=True)
    ]


def label_order(label: str) -> tuple[tuple[str, int, float, str], ...]:
    """A row label's sort key: its words in turn, a `field=value` whose value is a number compared as a number
    (`scheduler.max_num_seqs=8` before `=16`, as text would not), numbers before text for one field."""
    return tuple(_word_order(word) for word in label.split(" "))


def _word_order(word: str) -> tuple[str, int, float, str]:
    name, eq, value = word.partition("=")
    if not eq:
        return (name, 1, 0.0, "")
    try:
        number = float(value)
    except ValueError:
        return (name, 1, 0.0, value)
    return (name, 1, 0.0, value) if number != number else (name, 0, number, "")  # nan: as text


def ms(x: Any) -> str:
    return "–" if x is None else f"{x:.3f}" if x < 10 else f"{x:.2f}" if x < 100 else f"{x:.1f}"


def spread(r: Record, name: str) -> str:
    """The median and, over two or more timed runs, their range: `1.507 (1.231–1.782)`."""
    runs = [x for x in r.get(f"{name}_all") or [] if x is not None]
    if len(runs) < 2:
        return ms(r[name])
    return f"{ms(r[name])} ({ms(min(runs))}–{ms(max(runs))})"
