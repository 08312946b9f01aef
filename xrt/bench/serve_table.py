"""The serve scenario's output: the block `vllm bench serve` prints at the end of a run (same lines, same order, E2EL
and the server's own mean TTFT added), and results.md's tables: one per (model, lengths, device), a row per request
rate and label (executor and the fields a sweep varies, as the other tables' rows: xrt.bench.cells)."""

from __future__ import annotations

from typing import Any

from xrt.bench.cells import ms, row_labels
from xrt.bench.results import Record
from xrt.bench.serve_metrics import percentile_key

TITLES = (("ttft", "Time to First Token", "TTFT"), ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
          ("itl", "Inter-token Latency", "ITL"), ("e2el", "End-to-end Latency", "E2EL"))
WIDTH = 50


def _row(name: str, value: Any, digits: int = 2) -> str:
    shown = "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return f"{name:<40} {shown:<10}"


def result_lines(r: Record) -> list[str]:
    lines = [" Serving Benchmark Result ".center(WIDTH, "="), _row("Successful requests:", r["completed"]),
             _row("Failed requests:", r["failed"])]
    if r["max_concurrency"]:
        lines.append(_row("Maximum request concurrency:", r["max_concurrency"]))
    lines += [
        _row("Benchmark duration (s):", r["duration"]),
        _row("Total input tokens:", r["total_input_tokens"]),
        _row("Total generated tokens:", r["total_output_tokens"]),
        _row("Request throughput (req/s):", r["request_throughput"]),
    ]
    if r["request_goodput"] is not None:
        lines.append(_row("Request goodput (req/s):", r["request_goodput"]))
    lines += [
        _row("Output token throughput (tok/s):", r["output_throughput"]),
        _row("Peak concurrent requests:", r["peak_concurrent_requests"]),
        _row("Total Token throughput (tok/s):", r["total_token_throughput"]),
    ]
    for key, title, short in TITLES:
        lines += [f"{title}".center(WIDTH, "-"), _row(f"Mean {short} (ms):", r[f"mean_{key}_ms"]),
                  _row(f"Median {short} (ms):", r[f"median_{key}_ms"])]
        lines += [_row(f"{percentile_key(p).upper()} {short} (ms):", r[f"{percentile_key(p)}_{key}_ms"])
                  for p in r["percentiles"]]
        if key == "ttft" and r.get("server_mean_ttft_ms") is not None:
            lines.append(_row("Server's mean TTFT (ms):", r["server_mean_ttft_ms"]))
        if key == "ttft" and r.get("server_mean_prefill_ms") is not None:
            lines.append(_row("  of which queue (ms):", r["server_mean_queue_ms"]))
            lines.append(_row("  of which prefill (ms):", r["server_mean_prefill_ms"]))
        if key == "ttft" and r.get("http_rtt_ms") is not None:
            lines.append(_row("HTTP round trip, GET /v1/models (ms):", r["http_rtt_ms"]))
    if r["errors"]:
        lines.append(f"first errors: {'; '.join(r['errors'])}")
    return [*lines, "=" * WIDTH]


def rate_label(rate: float) -> str:
    return f"{rate:g}/s" if rate else "all at once"


def _rate(r: Record) -> str:
    burst = f", burstiness {r['burstiness']:g}" if r["request_rate"] and r["burstiness"] != 1 else ""
    return rate_label(r["request_rate"]) + burst


def _latency(r: Record, key: str) -> str:
    tails = [r[f"{percentile_key(p)}_{key}_ms"] for p in r["percentiles"]]
    cells = [r[f"mean_{key}_ms"], r[f"median_{key}_ms"], *tails]
    return " / ".join(ms(x) for x in cells)


def _goodput(r: Record) -> str:
    if r["request_goodput"] is None:
        return "–"
    return f"{r['request_goodput']:.2f} ({', '.join(f'{k} ≤ {v:g}' for k, v in r['slo_ms'].items())})"


GroupKey = tuple[Any, ...]
SERVE_KEY = ("model", "input_len", "output_len", "range_ratio", "device_name")


def serve_groups(records: list[Record]) -> dict[GroupKey, list[Record]]:
    """Rows per (model, lengths, device), each with its "label" (executor and the fields a sweep varies), in the
    order they ran."""
    groups: dict[GroupKey, list[Record]] = {}
    for r in records:
        if r.get("scenario") == "serve":
            groups.setdefault(tuple(r.get(k) for k in SERVE_KEY), []).append(r)
    return {k: [{**r, "label": label} for r, label in zip(rs, row_labels(rs), strict=True)]
            for k, rs in groups.items()}


def _table(key: GroupKey, rows: list[Record]) -> list[str]:
    model, input_len, output_len, ratio, dev = key
    spread = f" ±{100 * ratio:.0f}%" if ratio else ""
    quantiles = sorted({percentile_key(p) for r in rows for p in r["percentiles"]})
    lines = [
        f"## Serve: {model}, input {input_len} / output {output_len}{spread}, {dev}",
        "",
        f"{rows[0]['num_requests']} requests per rate; ms cells: mean / median / {' / '.join(quantiles)} (each "
        "row's bench.percentiles); server TTFT: the server's own histogram mean; HTTP: the client's median round trip "
        "of GET /v1/models (the HTTP share of a TTFT).",
        "",
        "| label | rate | max in flight | completed (failed) | duration s | req/s | goodput req/s | output tok/s "
        "| total tok/s | TTFT ms | server TTFT ms | queue + prefill ms | HTTP ms | TPOT ms | ITL ms | E2EL ms |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        cells = [r["label"], _rate(r), f"{r['max_concurrency'] or '–'} (peak {r['peak_concurrent_requests']})",
                 f"{r['completed']} ({r['failed']})", f"{r['duration']:.2f}", f"{r['request_throughput']:.2f}",
                 _goodput(r), f"{r['output_throughput']:.0f}", f"{r['total_token_throughput']:.0f}",
                 _latency(r, "ttft"), ms(r.get("server_mean_ttft_ms")), _engine_part(r), ms(r.get("http_rtt_ms")),
                 *(_latency(r, key) for key in ("tpot", "itl", "e2el"))]
        lines.append(f"| {' | '.join(cells)} |")
    return lines


def render_serve(records: list[Record]) -> list[str]:
    """The serve tables and their note; [] without serve lines."""
    groups = serve_groups(records)
    lines: list[str] = []
    for key, rows in groups.items():
        lines += _table(key, rows) + [""]
    return [*lines, SERVE_NOTE, ""] if groups else []


SERVE_NOTE = (
    "Serve: a separate client process sends bench.num_requests streamed /v1/completions requests (seeded random "
    "token ids, greedy, ignore_eos) at each bench.request_rate, at most bench.max_concurrency in flight; throughput "
    "over the run's duration counts completed requests only; TTFT to the first streamed chunk, TPOT = (E2EL - TTFT) "
    "/ (output tokens - 1), ITL = the gaps between a stream's chunks, E2EL to the stream's end; goodput = requests "
    "within every SLO (bench.slo_*) per second. The figures and their JSON keys are vLLM's; peak = most requests "
    "in flight at one instant."
)


def _engine_part(r: Record) -> str:
    """The engine's part of the server's TTFT: queue + prefill (TTFT less both: the way back to the event loop)."""
    queue, prefill = r.get("server_mean_queue_ms"), r.get("server_mean_prefill_ms")
    return "–" if queue is None or prefill is None else f"{queue:.2f} + {prefill:.2f}"
