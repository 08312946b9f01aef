"""The serve scenario's figures from its client's per-request timings, as `vllm bench serve` computes them
(`calculate_metrics` in vllm/benchmarks/serve.py) and under its JSON keys, so the two results compare key for key:
throughput over the run's duration (first request sent to last stream ended), counting only completed requests;
TTFT, TPOT = (E2EL - TTFT) / (output tokens - 1) for requests of more than one token, ITL = every gap between two
chunks of one stream, E2EL; each as mean, median, standard deviation and the asked percentiles (numpy's linear
interpolation, as vLLM's), in ms; goodput = completed requests within every SLO set (TTFT, TPOT (0 for a one-token
request), E2EL) per second. Where vLLM reports 0 for a metric with no sample (every output one token long: no
TPOT), this reports None."""

from __future__ import annotations

from typing import Any

import numpy as np

from xrt.bench.results import Record
from xrt.config import BenchArgs, BenchObjective

METRICS = ("ttft", "tpot", "itl", "e2el")
# What a sweep's objective reads of a serve line (xrt.bench.sweep_results.objective_value).
OBJECTIVE_KEYS = {
    BenchObjective.TTFT_MS: "mean_ttft_ms",
    BenchObjective.TPOT_MS: "mean_tpot_ms",
    BenchObjective.TOKENS_PER_S: "total_token_throughput",
    BenchObjective.OUTPUT_TOKENS_PER_S: "output_throughput",
    BenchObjective.REQUESTS_PER_S: "request_throughput",
    BenchObjective.GOODPUT: "request_goodput",
}


def slos_ms(bench: BenchArgs) -> dict[str, float]:
    """The goodput bounds set (bench.slo_*), by the metric they bound."""
    given = {"ttft": bench.slo_ttft_ms, "tpot": bench.slo_tpot_ms, "e2el": bench.slo_e2e_ms}
    return {k: v for k, v in given.items() if v > 0}


def objective_key(record: Record, metric: BenchObjective) -> str:
    """The key of `record` that holds `metric`: the vLLM name on a serve line, the metric's own elsewhere."""
    return OBJECTIVE_KEYS.get(metric, metric.value) if record.get("scenario") == "serve" else metric.value


def percentile_key(p: float) -> str:
    """`p99`, `p99.9`: vLLM's names."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def _tpot(r: dict[str, Any]) -> float | None:
    n = r["output_tokens"]
    return (r["latency"] - r["ttft"]) / (n - 1) if n > 1 else None


def _stats(name: str, seconds: list[float], percentiles: list[float]) -> dict[str, float | None]:
    ms = np.asarray(seconds, dtype=np.float64) * 1000
    have = ms.size > 0
    out: dict[str, float | None] = {
        f"mean_{name}_ms": float(ms.mean()) if have else None,
        f"median_{name}_ms": float(np.median(ms)) if have else None,
        f"std_{name}_ms": float(ms.std()) if have else None,
    }
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = float(np.percentile(ms, p)) if have else None
    return out


def server_times(seen: dict[str, dict[str, float]] | None) -> Record:
    """The server's own means over the timed requests, beside the client's: TTFT, and the engine's part of it (queue:
    arrival to the first step; prefill: that step to the end of the one that made the first token), from its
    Prometheus histograms' sums and counts gained during the run (xrt.bench.serve_client.histograms). The server's
    clock starts when the request reaches it and stops when its event loop has the token, the client's before sending
    and once the chunk is in: the gap is HTTP's; TTFT less queue and prefill is the way back from the engine."""
    seen = seen or {}

    def mean_ms(name: str) -> float | None:
        h = seen.get(name)
        return 1000 * h["sum"] / h["count"] if h and h["count"] else None

    ttft = seen.get("ttft")
    return {"server_mean_ttft_ms": mean_ms("ttft"), "server_ttft_count": int(ttft["count"]) if ttft else None,
            "server_mean_queue_ms": mean_ms("queue"), "server_mean_prefill_ms": mean_ms("prefill")}


def peak_concurrency(requests: list[dict[str, Any]]) -> int:
    """Most requests in flight at one instant, from their start and E2EL (one ending as another starts: not both)."""
    events = sorted([(r["start"], 1) for r in requests] + [(r["start"] + r["latency"], -1) for r in requests])
    peak = live = 0
    for _, step in events:  # at equal times -1 sorts first
        live += step
        peak = max(peak, live)
    return peak


def good(r: dict[str, Any], slos_ms: dict[str, float]) -> bool:
    """Within every SLO set; a one-token request's TPOT counts as 0 (vLLM's rule)."""
    values = {"ttft": r["ttft"], "tpot": _tpot(r) or 0.0, "e2el": r["latency"]}
    return all(values[k] * 1000 <= bound for k, bound in slos_ms.items())


def serve_metrics(requests: list[dict[str, Any]], duration_s: float, percentiles: list[float],
                  slos_ms: dict[str, float]) -> Record:
    """requests: the client's (`xrt.bench.serve_client.send`): ok, ttft, itl, latency (s), prompt_len,
    output_tokens, cached_tokens."""
    done = [r for r in requests if r["ok"]]
    inputs = sum(r["prompt_len"] for r in done)
    outputs = sum(r["output_tokens"] for r in done)
    tpots = [t for t in map(_tpot, done) if t is not None]
    rec: Record = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(requests) - len(done),
        "total_input_tokens": inputs,
        "total_output_tokens": outputs,
        "cached_prompt_tokens": sum(r.get("cached_tokens") or 0 for r in done),
        "request_throughput": len(done) / duration_s,
        "request_goodput": sum(good(r, slos_ms) for r in done) / duration_s if slos_ms else None,
        "output_throughput": outputs / duration_s,
        "total_token_throughput": (inputs + outputs) / duration_s,
        "peak_concurrent_requests": peak_concurrency(requests),
    }
    samples = {"ttft": [r["ttft"] for r in done], "tpot": tpots, "itl": [g for r in done for g in r["itl"]],
               "e2el": [r["latency"] for r in done]}
    for name in METRICS:
        rec.update(_stats(name, samples[name], percentiles))
    return rec
