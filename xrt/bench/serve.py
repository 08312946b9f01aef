"""Serve scenario (`bench.scenario=serve`): requests over HTTP to an OpenAI-compatible server, measured as
`vllm bench serve` measures them (xrt.bench.serve_metrics: TTFT, TPOT, ITL, E2EL, request and token throughput,
goodput).

The server is `xrt serve` of this config, started in-process on a free port of 127.0.0.1 (uvicorn and the engine
loop on their threads, as `python -m xrt serve` runs them; `serve.*` applies but host and port), or the one at
bench.serve_url (then the config only shapes the workload: model.vocab_size bounds the token ids). The client is
a separate process (xrt.bench.serve_client). The workload is vLLM's random dataset: bench.num_requests prompts of
seeded random token ids, input and output lengths within bench.range_ratio of bench.input_len and
bench.output_len, greedy with ignore_eos so every request generates its length; sent at bench.request_rate (a
gamma process of bench.burstiness; 0: all at once), at most bench.max_concurrency in flight, after bench.warmup
untimed requests of other prompts. One run, one result line (bench.iters does not apply)."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import xrt
from xrt.bench.engine_timing import Progress
from xrt.bench.environment import adjusted, config_dict, environment, scenario_head
from xrt.bench.latency import free_memory
from xrt.bench.results import Record
from xrt.bench.serve_metrics import serve_metrics, slos_ms
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
    given = config_dict(cfg)
    cfg = serve_config(cfg)
    b = cfg.bench
    if importlib.util.find_spec("httpx") is None:
        raise BenchError("bench.scenario: serve's client needs httpx (pip install 'xrt[bench]')")
    vocab = cfg.model.vocab_size
    ins, outs = serve_lengths(cfg)
    warm = list(range(min(b.warmup, b.num_requests)))
    spec: dict[str, Any] = {
        "api_key": cfg.serve.api_key,
        "prompts": prompts_of_lengths(vocab, ins, cfg.seed, 0),
        "max_tokens": outs,
        "offsets": arrival_offsets(b.num_requests, b.request_rate, b.burstiness, cfg.seed),
        "max_concurrency": b.max_concurrency,
        "warmup_prompts": prompts_of_lengths(vocab, [ins[i] for i in warm], cfg.seed, WARMUP_REP),
        "warmup_max_tokens": min(b.output_len, WARMUP_TOKENS),
        "log_level": cfg.log_level.value,
    }
    device = resolve_device(cfg)
    with _server(cfg, progress) as (url, model):
        progress(f"[bench] serve: {b.num_requests} requests to {url}, "
                 f"{f'{b.request_rate:g}/s' if b.request_rate else 'all at once'}"
                 + (f", at most {b.max_concurrency} in flight" if b.max_concurrency else ""))
        result = run_client({**spec, "base_url": url, "model": model})
    free_memory(device)
    if "error" in result:
        raise BenchError(result["error"])
    requests = result["requests"]
    metrics = serve_metrics(requests, result["duration"], b.percentiles, slos_ms(b))
    if not metrics["completed"]:
        raise BenchError(f"bench.scenario: every one of the {len(requests)} requests failed, the first with: "
                         f"{requests[0]['error']}")
    head = scenario_head("serve", cfg, device)
    where = {**environment(device)}
    if b.serve_url:  # the config does not describe a server it did not start
        head.update(executor="external", model=result["model"], dtype=None)
        where.update(device=None, device_name=b.serve_url)
    rec: Record = {
        **head,
        "served_model": result["model"],
        "num_requests": b.num_requests,
        "request_rate": b.request_rate,
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
        "errors": list(dict.fromkeys(r["error"] for r in requests if not r["ok"]))[:ERRORS_KEPT],
        **where,
        "config": given,
        "adjusted": adjusted(given, config_dict(cfg)),
    }
    for line in result_lines(rec):
        progress(line)
    return [rec]


@contextmanager
def _server(cfg: XrtConfig, progress: Progress) -> Iterator[tuple[str, str]]:
    """(base URL, model name; "" for the client to ask /v1/models)."""
    if cfg.bench.serve_url:
        yield cfg.bench.serve_url.rstrip("/"), ""
        return
    try:
        from xrt.serve.app import build_state
        from xrt.serve.server import BackgroundServer
    except ImportError as e:
        raise BenchError(f"bench.scenario: serve starts xrt serve, which needs the serve extra "
                         f"(pip install 'xrt[serve]'): {e}") from None
    from xrt.engine.llm import LLM

    with LLM(cfg) as llm:
        state = build_state(llm.engine, cfg.serve, cfg.model.name, cfg.sampling, cfg.scheduler.max_num_seqs)
        server = BackgroundServer(state).start()
        progress(f"[bench] serve: xrt serve of {state.model_name} ({cfg.executor.kind.value}) on {server.url}")
        try:
            yield server.url, state.model_name
        finally:
            server.stop()


def run_client(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs xrt.bench.serve_client in its own process: the spec in, its result (or {"error": line}) back. Its
    progress goes to this process's stderr."""
    # Run from the directory holding the xrt this process runs (`-m` looks there first), also from a source tree.
    root = Path(xrt.__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "xrt.bench.serve_client"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=root)
    try:
        out, _ = proc.communicate(json.dumps(spec).encode())
    finally:
        if proc.poll() is None:  # interrupted: the client must not outlive the run
            proc.kill()
            proc.wait()
    try:
        return json.loads(out)
    except ValueError:
        return {"error": f"the serve benchmark's client exited with status {proc.returncode} and no result"}
