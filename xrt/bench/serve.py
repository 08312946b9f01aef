"""Serve scenario (`bench.scenario=serve`): requests over HTTP to an OpenAI-compatible server, measured as
`vllm bench serve` measures them (xrt.bench.serve_metrics: TTFT, TPOT, ITL, E2EL, request and token throughput,
goodput).

The server is `xrt serve` of this config, started in-process on a free port of 127.0.0.1 (uvicorn and the engine
loop on their threads, as `python -m xrt serve` runs them; `serve.*` applies but host and port), or the one at
bench.url (then the config only shapes the workload: model.vocab_size bounds the token ids). The client is
a separate process (xrt.bench.serve_client). The workload is vLLM's random dataset: bench.num_requests prompts of
seeded random token ids, input and output lengths within bench.range_ratio of bench.input_len and
bench.output_len, greedy with ignore_eos so every request generates its length; sent at each bench.request_rate in
turn (a gamma process of bench.burstiness, Poisson at 1; 0: all at once), new prompt ids for each rate so none is a
prefix-cache hit, at most bench.max_concurrency in flight, after bench.warmup untimed requests of other prompts
(before the first rate). One result line per rate, with the server's own mean TTFT from its /metrics beside the
client's; bench.iters does not apply."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from xrt.bench.child import run_child
from xrt.bench.engine_timing import Progress
from xrt.bench.environment import adjusted, config_dict, environment, scenario_head
from xrt.bench.latency import free_memory
from xrt.bench.results import Record
from xrt.bench.serve_metrics import serve_metrics, server_times, slos_ms
from xrt.bench.serve_table import result_lines
from xrt.bench.setup import BenchError
from xrt.bench.workload import WARMUP_REP, arrival_offsets, prompts_of_lengths, serve_lengths
from xrt.config import XrtConfig
from xrt.executor.device import resolve_device

WARMUP_TOKENS = 16  # at most, generated per warm-up request
ERRORS_KEPT = 5  # distinct failure messages a result line keeps


def serve_config(cfg: XrtConfig) -> XrtConfig:
    """The scenario's copy of the config: the longest request fits model.max_model_len, and a burst of every
    request at once fits the server's queue (serve.max_queued) instead of getting 503s."""
    c = copy.deepcopy(cfg)
    b = c.bench
    # A string field takes any text when composing (xrt.config.verbatim); a URL is checked where it is used.
    if b.url and not b.url.startswith(("http://", "https://")):
        raise BenchError(f"bench.url: expected http://HOST:PORT or https://..., got {b.url!r}")
    ins, outs = serve_lengths(c)
    need = max(ins) + max(outs)
    if need > c.model.max_position_embeddings:
        raise BenchError(
            f"bench.input_len + bench.output_len: the longest request (bench.range_ratio={b.range_ratio:g}) needs "
            f"{need} tokens, more than model.max_position_embeddings={c.model.max_position_embeddings}"
        )
    c.model.max_model_len = max(c.model.max_model_len, need)
    c.serve.max_queued = max(c.serve.max_queued, b.num_requests)
    return c


def run_serve(cfg: XrtConfig, progress: Progress) -> list[Record]:
    """One result line per bench.request_rate, in order, all against one server."""
    given = config_dict(cfg)
    cfg = serve_config(cfg)
    b = cfg.bench
    if importlib.util.find_spec("aiohttp") is None:
        raise BenchError("bench.scenario: serve's client needs aiohttp (pip install 'xrt[bench]')")
    ins, outs = serve_lengths(cfg)
    warm = list(range(min(b.warmup, b.num_requests)))
    device = resolve_device(cfg)
    records: list[Record] = []
    with _server(cfg, progress) as (url, model):
        for i, rate in enumerate(b.request_rate):
            progress(f"[bench] serve: {b.num_requests} requests to {url}, {_rate(rate)}"
                     + (f", at most {b.max_concurrency} in flight" if b.max_concurrency else ""))
            spec = {
                "base_url": url, "model": model, "api_key": cfg.serve.api_key, "max_concurrency": b.max_concurrency,
                # Other ids at each rate: a prompt sent again would be a prefix-cache hit.
                "prompts": prompts_of_lengths(cfg.model.vocab_size, ins, cfg.seed, i), "max_tokens": outs,
                "offsets": arrival_offsets(b.num_requests, rate, b.burstiness, cfg.seed + i),
                # The first rate's warm-up warms the server for the rest.
                "warmup_prompts": [] if i else prompts_of_lengths(cfg.model.vocab_size, [ins[w] for w in warm],
                                                                  cfg.seed, WARMUP_REP),
                "warmup_max_tokens": min(b.output_len, WARMUP_TOKENS), "log_level": cfg.log_level.value,
            }
            result = run_client(spec)
            if "error" in result:
                raise BenchError(result["error"])
            records.append(_record(cfg, given, rate, result, device))
            for line in result_lines(records[-1]):
                progress(line)
    free_memory(device)
    return records


def _rate(rate: float) -> str:
    return f"{rate:g} requests/s" if rate else "all at once"


def _record(cfg: XrtConfig, given: dict[str, Any], rate: float, result: dict[str, Any],
            device: torch.device) -> Record:
    b = cfg.bench
    requests = result["requests"]
    metrics = serve_metrics(requests, result["duration"], b.percentiles, slos_ms(b))
    if not metrics["completed"]:
        raise BenchError(f"bench.scenario: every one of the {len(requests)} requests at {_rate(rate)} failed, the "
                         f"first with: {requests[0]['error']}")
    head = scenario_head("serve", cfg, device)
    where = environment(device)
    if b.url:  # the config does not describe a server it did not start
        head.update(executor="external", model=result["model"], dtype=None)
        where.update(device=None, device_name=b.url)
    return {
        **head,
        "served_model": result["model"],
        "num_requests": b.num_requests,
        "request_rate": rate,
        "burstiness": b.burstiness,
        "max_concurrency": b.max_concurrency,
        "input_len": b.input_len,
        "output_len": b.output_len,
        "range_ratio": b.range_ratio,
        "warmup": b.warmup,
        "tp": cfg.parallel.tp,
        "percentiles": list(b.percentiles),
        "slo_ms": slos_ms(b),
        **metrics,
        **server_times(result.get("server")),
        "http_rtt_ms": None if result.get("http_rtt") is None else result["http_rtt"] * 1e3,
        "errors": list(dict.fromkeys(r["error"] for r in requests if not r["ok"]))[:ERRORS_KEPT],
        **where,
        "config": given,
        "adjusted": adjusted(given, config_dict(cfg)),
    }


@contextmanager
def _server(cfg: XrtConfig, progress: Progress) -> Iterator[tuple[str, str]]:
    """(base URL, model name; "" for the client to ask /v1/models)."""
    if cfg.bench.url:
        yield cfg.bench.url.rstrip("/"), ""
        return
    try:
        from xrt.serve.app import build_state
        from xrt.serve.server import BackgroundServer
    except ImportError as e:
        raise BenchError(f"bench.scenario: serve starts xrt serve, which needs the serve extra "
                         f"(pip install 'xrt[serve]'): {e}") from None
    try:
        state = build_state(cfg)
    except (ValueError, OSError) as e:
        raise BenchError(f"bench.scenario: serve: the server cannot start: {e}") from None
    try:
        server = BackgroundServer(state).start()
    except BaseException:
        state.close()
        raise
    where = "its own process" if cfg.serve.engine_process else "a thread of the server"
    progress(f"[bench] serve: xrt serve of {state.model_name} ({cfg.executor.kind.value}, the engine in {where}) "
             f"on {server.url}")
    try:
        yield server.url, state.model_name
    finally:
        server.stop()


def run_client(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs xrt.bench.serve_client in its own process: the spec in, its result (or {"error": line}) back. Its
    progress goes to this process's stderr."""
    return run_child("xrt.bench.serve_client", spec, "the serve benchmark's client")
