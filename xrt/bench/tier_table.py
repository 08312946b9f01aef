"""results.md's tables of the KV-tier scenarios: prefix (TTFT by where the prefix comes from, one row per prefix
length) and multiturn (one row per cache.tiers setting). Rows are grouped and labelled as the latency table's
(xrt.bench.cells); a later line for the same row replaces an earlier one."""

from __future__ import annotations

from typing import Any

from xrt.bench.cells import label_order, ms, row_labels, spread
from xrt.bench.results import Record

PREFIX_PHASES = (
    ("cold", "cold (gpu)"),
    ("tiered_cold", "cold (l1_l2)"),
    ("gpu", "GPU hit"),
    ("l1", "L1 hit"),
    ("l2", "L2 after restart"),
)
GroupKey = tuple[Any, ...]


def _grouped(records: list[Record], scenario: str, key: tuple[str, ...], row: str) -> dict[GroupKey, list[Record]]:
    groups: dict[GroupKey, list[Record]] = {}
    for r in records:
        if r.get("scenario") == scenario:
            groups.setdefault(tuple(r.get(k) for k in key), []).append(r)
    out: dict[GroupKey, list[Record]] = {}
    for k, rs in groups.items():
        rows = {(label, r[row]): {**r, "label": label} for r, label in zip(rs, row_labels(rs), strict=True)}
        out[k] = list(rows.values())
    return out


PREFIX_KEY = ("model", "dtype", "device_name")
MULTITURN_KEY = ("model", "clients", "rounds", "turn_len", "output_len", "dtype", "device_name")


def prefix_groups(records: list[Record]) -> dict[GroupKey, list[Record]]:
    """Rows per (model, dtype, device), sorted by label then prefix length."""
    groups = _grouped(records, "prefix", PREFIX_KEY, "prefix_len")
    return {k: sorted(v, key=lambda r: (label_order(r["label"]), r["prefix_len"])) for k, v in groups.items()}


def multiturn_groups(records: list[Record]) -> dict[GroupKey, list[Record]]:
    """Rows per (model, workload, dtype, device), in the order they ran."""
    return _grouped(records, "multiturn", MULTITURN_KEY, "tiers")


def _gbps(x: Any) -> str:
    return "–" if x is None else f"{x:.2f}"


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _phase(r: Record, phase: str) -> str:
    if r.get(f"{phase}_ttft_ms") is None:
        return "–"
    frac = r.get(f"{phase}_ttft_frac")
    return spread(r, f"{phase}_ttft_ms") + ("" if phase == "cold" or frac is None else f" · {frac:.2f}×")


def outputs_cell(r: Record) -> str:
    """identical; or whether the phases over restored KV (gpu, l1, l2) at least agree with each other."""
    if r["outputs_identical"]:
        return "identical"
    if r.get("restored_outputs_identical"):
        return "gpu/l1/l2 identical, cold differs"
    return "DIFFERENT (gpu/l1/l2 too)"


def _counters(stats: Any) -> str:
    if not isinstance(stats, dict) or not stats:
        return "–"
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(stats.items()) if v)


def _prefix_table(key: GroupKey, rows: list[Record]) -> list[str]:
    model, dtype, dev = key
    head = rows[0]
    probe = ""
    if head.get("disk_read_gbps") is not None:
        probe = (
            f"; the L2 directory reads {head['disk_read_gbps']:.2f} GB/s ({head['disk_read_mode']}), writes "
            f"{head['disk_write_gbps']:.2f} GB/s ({head['disk_write_mode']}), one stream of 16 MiB blocks"
        )
    lines = [
        f"## Prefix: TTFT by where the prefix comes from, {model}, {dtype}, {dev}",
        "",
        f"torch {head['torch']}, commit {head['git_commit']}, chunk {head['chunk_tokens']} tokens, page "
        f"{head['page_size']}, median of {head['iters']} (min–max), × = fraction of cold (gpu){probe}.",
        "",
        "| label | prefix | KV MB | "
        + " | ".join(f"{name} ms" for _, name in PREFIX_PHASES)
        + " | L2 choice | L2 load GB/s | of disk read | page cache | outputs |",
        "|---|--:|--:|" + "--:|" * len(PREFIX_PHASES) + "---|--:|--:|---|---|",
    ]
    for r in rows:
        cells = [_phase(r, p) for p, _ in PREFIX_PHASES]
        l2 = r["l2_choice"]
        if r.get("l2_cached_tokens"):
            l2 += f" ({r['l2_cached_tokens'].get('l2', 0)} tokens)"
        lines.append(
            f"| {r['label']} | {r['prefix_len']} | {r['kv_bytes'] / 1e6:.4g} | "
            + " | ".join(cells)
            + f" | {l2} | {_gbps(r.get('l2_load_gbps'))} | {_pct(r.get('l2_load_frac'))} | {r['page_cache']} "
            f"| {outputs_cell(r)} |"
        )
    lines += [
        "",
        "| label | prefix | tier stats: l1_l2 engine (all its phases) | tier stats: restarted engine (the L2 phase) |",
        "|---|--:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['prefix_len']} | {_counters(r.get('tier_stats_tiered'))} "
            f"| {_counters(r.get('tier_stats_restart'))} |"
        )
    return lines


def _tokens(n: Any) -> str:
    return "–" if n is None else f"{n:,}"


def _steps(steps: Any) -> str:
    """The prefill and decode cells of a run's StepTimes (records before it: dashes)."""
    if not steps:
        return "– | –"
    return (f"{steps['prefill_s']:.2f} ({steps['prefill_steps']}) | {steps['decode_s']:.2f} "
            f"({steps['decode_steps']}, {steps['decode_batch_mean']:.1f})")


def device_kv_name(device_type: str) -> str:
    """The KV pages of the device the model runs on, named for it (the tiers below are L1 and L2)."""
    return {"cuda": "GPU KV", "cpu": "CPU KV"}.get(device_type, "device KV")


def _multiturn_table(key: GroupKey, rows: list[Record]) -> list[str]:
    model, clients, rounds, turn_len, output_len, dtype, dev = key
    head = rows[0]
    kv = device_kv_name(str(head.get("device", "")).partition(":")[0])
    lines = [
        f"## Multiturn: {model}, {clients} clients x {rounds} rounds, turn {turn_len}, output {output_len}, "
        f"{dtype}, {dev}",
        "",
        f"torch {head['torch']}, commit {head['git_commit']}, chunk {head['chunk_tokens']} tokens, page "
        f"{head['page_size']}; working set = clients x final history.",
        "",
        "| label | tiers | requests/s | × first | tokens/s | output tokens/s | TTFT ms | TPOT ms "
        "| prefill s (steps) | decode s (steps, mean batch) "
        f"| prompt tokens gpu / l1 / l2 / computed | preempted | working set tokens | {kv} tokens | L1 + L2 tokens "
        "| outputs |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        c = r.get("cached_tokens") or {}
        served = (
            " / ".join(_tokens(c.get(t)) for t in ("gpu", "l1", "l2")) + f" / {_tokens(r['computed_prompt_tokens'])}"
        )
        same = "identical" if r["outputs_identical"] else f"{r['mismatched_requests']} differ"
        lines.append(
            f"| {r['label']} | {r['tiers']} | {r['requests_per_s']:.2f} | {r['requests_per_s_ratio']:.2f}× "
            f"| {r['tokens_per_s']:.0f} | {r['output_tokens_per_s']:.0f} | {ms(r['ttft_ms'])} "
            f"| {ms(r.get('tpot_ms'))} | {_steps(r.get('steps'))} "
            f"| {served} | {r.get('preemptions', 0)} | {_tokens(r['working_set_tokens'])} "
            f"| {_tokens(r['gpu_kv_tokens'])} | {_tokens(r['l1_tokens'] + r['l2_tokens'])} | {same} vs "
            f"{r['compared_with']} |"
        )
    return lines


PREFIX_NOTE, MULTITURN_NOTE = (
    "Prefix: one request at a time, TTFT = add_request to the first token. cold: a cache=gpu engine prefills the "
    "prompt (prefix + 1 token); cold (l1_l2): the same with the tiers storing its chunks; GPU hit: the prompt "
    "again; L1 hit: the GPU prefix cache evicted first; L2 after restart: that engine closed, its L2 files dropped "
    "from the page cache, a new engine (one unrelated prefill first), the prompt: loaded from L2 or recomputed "
    "(the policy's choice). L2 load GB/s = loaded bytes / load seconds of the tier stats; of disk read = that over "
    "the directory's O_DIRECT sequential read.",
    "Multiturn: every client submits history + a new turn each round, all at once; requests/s and tokens/s over "
    "the wall time of all rounds (prompt + output tokens); × first = requests/s over the first bench.compare_tiers "
    "setting's; prefill / decode s: host wall time of the engine steps that prefilled and of the others, their count "
    "and the decode steps' mean batch; prompt tokens by the tier that served their KV; outputs compared with the "
    "first setting's.",
)


def render_tiers(records: list[Record]) -> list[str]:
    """The prefix and multiturn tables and their notes; [] without such lines."""
    lines: list[str] = []
    prefix, multiturn = prefix_groups(records), multiturn_groups(records)
    for key, rows in prefix.items():
        lines += _prefix_table(key, rows) + [""]
    for key, rows in multiturn.items():
        lines += _multiturn_table(key, rows) + [""]
    notes = [PREFIX_NOTE] * bool(prefix) + [MULTITURN_NOTE] * bool(multiturn)
    return [*lines, *notes, ""] if notes else []
