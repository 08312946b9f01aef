"""results.md from the result lines: one latency table per (model, input, output, dtype, device), a
throughput table, the KV-tier scenarios' tables (prefix, multiturn: xrt.bench.tier_table), the serve scenario's
(xrt.bench.serve_table) and the kernels scenario's (xrt.bench.kernels.table). Later lines for the same row replace
earlier ones."""

from __future__ import annotations

from typing import Any

from xrt.bench.anchors import XLLM_INPUT_LEN, XLLM_OUTPUT_LEN, load_xllm
from xrt.bench.cells import label_order, ms, row_labels, spread
from xrt.bench.kernels.table import render_kernels
from xrt.bench.results import Record
from xrt.bench.serve_table import render_serve
from xrt.bench.tier_table import render_tiers

LatencyKey = tuple[str, int, int, str, str]

# Rows of one label and batch, one per peer (bench.peer=both measures two against one run of ours), in this order.
_PEER_ORDER = {"none": 0, "hf": 1, "compile": 2}


def latency_groups(records: list[Record]) -> dict[LatencyKey, list[Record]]:
    """Rows per (model, lengths, dtype, device), each with a "label" (executor and swept fields); the
    last line per (label, batch, peer) wins; sorted by label (numbers as numbers), batch, then peer."""
    groups: dict[LatencyKey, list[Record]] = {}
    for r in records:
        if r.get("scenario") == "latency":
            key = (r["model"], r["input_len"], r["output_len"], r["dtype"], r["device_name"])
            groups.setdefault(key, []).append(r)
    out: dict[LatencyKey, list[Record]] = {}
    for key, rs in groups.items():
        rows = {(label, r["batch"], r.get("peer", "none")): {**r, "label": label}
                for r, label in zip(rs, row_labels(rs), strict=True)}
        out[key] = [rows[x] for x in sorted(rows, key=lambda k: (label_order(k[0]), k[1], _PEER_ORDER.get(k[2], 3)))]
    return out


def throughput_rows(records: list[Record]) -> list[Record]:
    return [r for r in records if r.get("scenario") == "throughput"]


def _ratio(x: Any) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _pair(a: Any, b: Any) -> str:
    return "–" if a is None and b is None else f"{ms(a)} / {ms(b)}"


def _latency_table(key: LatencyKey, rows: list[Record]) -> list[str]:
    model, input_len, output_len, dtype, dev = key
    xllm = load_xllm() if (input_len, output_len) == (XLLM_INPUT_LEN, XLLM_OUTPUT_LEN) else {}
    head = rows[0]
    lines = [
        f"## Latency: {model}, input {input_len}, output {output_len}, {dtype}, {dev}",
        "",
        f"torch {head['torch']}, commit {head['git_commit']}, warm-up {head['warmup']}, "
        f"median of {head['iters']}; copy bandwidth {head.get('bandwidth_gbps') or 0:.0f} GB/s.",
        "",
        "| executor | batch | bucket | TTFT ms (min–max) | TPOT ms (min–max) | HF TTFT ms | HF TPOT ms "
        "| HF/ours TTFT | HF/ours TPOT | xLLM py_graph TTFT / TPOT | xLLM cpp_graph TTFT / TPOT | floor ms "
        "| % of floor |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        x = xllm.get(r["batch"], {})
        bucket = "–" if r.get("bucket") is None else str(r["bucket"])
        if r["status"] != "ok":
            lines.append(f"| {r['label']} | {r['batch']} | {bucket} | skipped: {r['reason']} |" + " |" * 9)
            continue
        pct = "–" if r.get("floor_pct") is None else f"{r['floor_pct']:.{0 if r['floor_pct'] >= 10 else 1}f}%"
        lines.append(
            f"| {r['label']} | {r['batch']} | {bucket} | {spread(r, 'ttft_ms')} | {spread(r, 'tpot_ms')} "
            f"| {_peer(r, 'ttft')} | {_peer(r, 'tpot')} "
            f"| {_ratio(r.get('peer_ttft_ratio'))} | {_ratio(r.get('peer_tpot_ratio'))} "
            f"| {_pair(x.get('py_graph_ttft'), x.get('py_graph_tpot'))} "
            f"| {_pair(x.get('cpp_graph_ttft'), x.get('cpp_graph_tpot'))} "
            f"| {ms(r.get('floor_ms'))} | {pct} |"
        )
    return lines


def _peer(r: Record, metric: str) -> str:
    """The peer's figure, marked when it is HF compiled (bench.peer=compile) rather than as it comes."""
    value = ms(r.get(f"peer_{metric}_ms"))
    return f"{value} (compiled)" if r.get("peer") == "compile" and r.get(f"peer_{metric}_ms") is not None else value


def _throughput_table(rows: list[Record]) -> list[str]:
    lines = [
        "## Throughput (all requests submitted at once)",
        "",
        "| executor | model | device | requests | lengths | input tokens | output tokens | wall s "
        "| tokens/s | output tokens/s | invocations: tokens/s (spread) |",
        "|---|---|---|--:|---|--:|--:|--:|--:|--:|---|",
    ]
    # Labelled as the latency rows are: a sweep's rows differ by the fields it varies.
    for r, label in zip(rows, row_labels(rows), strict=True):
        lines.append(
            f"| {label} | {r['model']} | {r['device_name']} | {r['num_requests']} "
            f"| {r['min_len']}..{r['max_len']} | {r['input_tokens']} | {r['output_tokens']} | {_walls(r)} "
            f"| {r['tokens_per_s']:.0f} | {r['output_tokens_per_s']:.0f} | {_invocations(r)} |"
        )
    return lines


def _walls(r: Record) -> str:
    """The median timed run's wall seconds, (min–max) over every run (of every invocation) when there were several."""
    walls = r.get("wall_s_all") or [r["wall_s"]]
    median = f"{r['wall_s']:.2f}"
    return median if len(walls) < 2 else f"{median} ({min(walls):.2f}–{max(walls):.2f})"


def _invocations(r: Record) -> str:
    """`bench.invocations` > 1: each process's tokens/s and (max - min) / median; else 1."""
    tps = r.get("tokens_per_s_invocations")
    if not tps:
        return "1"
    return f"{len(tps)}: {', '.join(f'{t:.0f}' for t in tps)} ({r['tokens_per_s_spread']:.0%})"


NOTES = [
    "TTFT: wall time of the prefill of the whole batch (until every sequence has its first token). "
    "TPOT: mean decode step. TTFT and TPOT are the median of the timed runs, (min–max) across them. "
    "HF: transformers Qwen3ForCausalLM, same shape and dtype, in the same run; HF/ours > 1 means we are faster; "
    "(compiled): its decode step under torch.compile on a static cache (bench.peer=compile). "
    "xLLM: published H100 figures (PR 1891), shown only for input 1024 / output 256. "
    "floor: (weight bytes + KV bytes read by a mean decode step) / measured copy bandwidth; "
    "% of floor = floor / TPOT.",
]


def render_markdown(records: list[Record]) -> str:
    lines = ["# xrt bench", ""]
    latency = latency_groups(records)
    for key, rows in latency.items():
        lines += _latency_table(key, rows) + [""]
    tput = throughput_rows(records)
    if tput:
        lines += _throughput_table(tput) + [""]
    tiers = render_tiers(records)
    lines += tiers
    serve = render_serve(records)
    lines += serve
    kernels = render_kernels(records)
    lines += kernels
    if latency or tput or not (kernels or tiers or serve):
        lines += NOTES
    return "\n".join(lines) + "\n"
