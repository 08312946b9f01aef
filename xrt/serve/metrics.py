"""Prometheus `/metrics` through prometheus_client, in an `xrt:` namespace with vLLM's names (what dashboards,
llm-d's gateway and Ray Serve already scrape) and a `model_name` label. Gauges come from the state the engine's
core sends with every step; counters and the engine's times (queue, prefill, decode, inference) are counted as each
step's deltas reach the event loop (xrt.serve.client), the client's latencies (TTFT, ITL, E2E) when the server hands
the tokens on: a streamed chunk once it is written to the connection (xrt.serve.app), so what a client waits for,
from the request's first bytes (xrt.serve.arrival) to its token on the wire, is on the server's clock but the
network and the client's own parsing. One registry per server, so two servers in one process (tests) do not share
counters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from xrt.engine.outputs import StreamOutput
from xrt.serve.core import EngineState
from xrt.serve.tier_metrics import TierCollector

if TYPE_CHECKING:
    from xrt.serve.jobs import Choice

# vLLM's buckets, so the histograms compare bucket for bucket.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
# The engine's finish reasons as OpenAI's (and vLLM's metric label): the limits are all "length".
OPENAI_FINISH = {"stop": "stop", "length": "length", "context_length": "length", "kv_cache": "length",
                 "abort": "abort"}


def openai_finish_reason(reason: str) -> str:
    return OPENAI_FINISH.get(reason, "error")


class Metrics:
    def __init__(self, model_name: str) -> None:
        disable_created_metrics()  # no `_created` series beside every counter (vLLM turns them off too)
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"xrt:{name}", doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"xrt:{name}", doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"xrt:{name}", doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.model_name = model_name
        self.tiers = TierCollector(model_name)
        r.register(self.tiers)
        self.running = gauge("num_requests_running", "requests in the batch (prefilling or decoding)")
        self.waiting = gauge("num_requests_waiting", "requests queued for the batch")
        self.kv_usage = gauge("kv_cache_usage_perc", "fraction of KV cache pages held by requests (1 = all)")
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "tokens generated")
        self.prefix_queries = counter("prefix_cache_queries", "prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("prefix_cache_hits", "prompt tokens whose KV came from a cache (GPU or tiers)")
        self._cached = Counter("xrt:cached_prompt_tokens", "prompt tokens whose KV came from a cache, by the tier "
                               "that held it (gpu, l1, l2)", [*labels, "tier"], registry=r)
        self._success = Counter("xrt:request_success", "finished requests by finish reason",
                                [*labels, "finished_reason"], registry=r)
        self.ttft = histogram("time_to_first_token_seconds", "request arrival to its first token", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "between a request's consecutive tokens", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "request arrival to its last token", LATENCY_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds", "request arrival to its first scheduled step",
                                    LATENCY_BUCKETS)
        # The engine's part of a request, from its steps' own end times: what is left of TTFT past queue and prefill
        # is the way between the engine and the event loop.
        self.prefill_time = histogram("request_prefill_time_seconds", "first scheduled step to the end of the step "
                                      "that made the first token", LATENCY_BUCKETS)
        self.decode_time = histogram("request_decode_time_seconds", "the step that made the first token to the one "
                                     "that made the last", LATENCY_BUCKETS)
        self.inference_time = histogram("request_inference_time_seconds", "first scheduled step to the end of the "
                                        "last", LATENCY_BUCKETS)

    def engine_state(self, state: EngineState) -> None:
        self.running.set(state.running)
        self.waiting.set(state.waiting)
        self.kv_usage.set(state.kv_usage)
        self.tiers.counters = state.tiers

    def engine_part(self, choice: Choice, delta: StreamOutput, at: float) -> None:
        """What a delta says of the engine's work, when it reaches the event loop: tokens, queue and prefill times,
        and at a request's end its decode and inference times and finish. at: when the step that made it ended."""
        scheduled = delta.scheduled_at
        if scheduled is not None and not choice.queue_timed:
            choice.queue_timed = True
            self.queue_time.observe(max(scheduled - choice.arrival, 0.0))
        n = len(delta.token_ids)
        if n:
            self.generation_tokens.inc(n)
            if choice.first_step_at is None:
                choice.first_step_at = at
                if scheduled is not None:
                    self.prefill_time.observe(max(at - scheduled, 0.0))
        out = delta.output
        if out is None:
            return
        if scheduled is not None:
            self.inference_time.observe(max(at - scheduled, 0.0))
        if choice.first_step_at is not None:
            self.decode_time.observe(max(at - choice.first_step_at, 0.0))
        self._success.labels(self.model_name, openai_finish_reason(out.finish_reason)).inc()
        num_prompt = len(out.prompt_token_ids)
        self.prompt_tokens.inc(num_prompt)
        self.prefix_queries.inc(num_prompt)
        self.prefix_hits.inc(out.num_cached_tokens)
        for tier, tokens in out.cached_tokens.items():
            if tokens:
                self._cached.labels(self.model_name, tier).inc(tokens)

    def delivered(self, choice: Choice, num_tokens: int, last: bool, now: float) -> None:
        """The client's latencies (TTFT, ITL, E2E), read when the server hands a choice's tokens on: a streamed
        chunk once it is written to the connection, a whole answer when its last delta reaches the event loop.
        last: the choice's last delta (its end)."""
        if num_tokens:
            if choice.last_token_at is None:
                self.ttft.observe(now - choice.arrival)
            else:
                gap = (now - choice.last_token_at) / num_tokens  # tokens sent together share the wait
                for _ in range(num_tokens):
                    self.itl.observe(gap)
            choice.last_token_at = now
        if last:
            self.e2e.observe(now - choice.arrival)
