"""The benchmark and profiling sections of the schema (`bench.*`, `profile.*`)."""

from __future__ import annotations

import enum

import attrs

from xrt.config.cache import KVTiers
from xrt.config.problems import Problems
from xrt.reflect import each, field, ge, gt, in_range


class BenchPeer(enum.Enum):
    NONE = "none"
    HF = "hf"
    COMPILE = "compile"
    BOTH = "both"

    @property
    def kinds(self) -> list[BenchPeer]:
        """The peers this setting measures, one at a time: both is hf then compile."""
        if self is BenchPeer.NONE:
            return []
        return [BenchPeer.HF, BenchPeer.COMPILE] if self is BenchPeer.BOTH else [self]


class BenchScenario(enum.Enum):
    LATENCY = "latency"
    THROUGHPUT = "throughput"
    KERNELS = "kernels"
    PREFIX = "prefix"  # TTFT by where a prompt's prefix comes from: recomputed, GPU pages, L1, L2 after a restart
    MULTITURN = "multiturn"  # clients' conversations whose KV outgrows the GPU pages, per cache.tiers setting
    SERVE = "serve"  # requests over HTTP to `xrt serve` (or bench.url): what `vllm bench serve` reports


class BenchObjective(enum.Enum):
    """What a bench job returns to Hydra's sweeper (Optuna optimises it; every sweep reports its best job)."""

    AUTO = "auto"  # latency: tpot_ms; throughput: tokens_per_s; prefix: l2_ttft_ms; multiturn: requests_per_s;
    # serve: goodput with a bench.slo_* set, else output_tokens_per_s; kernels: none
    TTFT_MS = "ttft_ms"  # latency, mean over bench.batch (one batch: TTFT at that batch); serve: mean over the
    # requests; lower is better
    TPOT_MS = "tpot_ms"  # latency, as ttft_ms
    TOKENS_PER_S = "tokens_per_s"  # throughput (serve too), input and output tokens; higher is better
    OUTPUT_TOKENS_PER_S = "output_tokens_per_s"  # throughput (serve too), output tokens only
    L2_TTFT_MS = "l2_ttft_ms"  # prefix: TTFT of a new engine whose prompt's prefix is in L2, mean over prefix_lens
    L1_TTFT_MS = "l1_ttft_ms"  # prefix: TTFT with the prefix in L1 (GPU prefix cache evicted), as l2_ttft_ms
    REQUESTS_PER_S = "requests_per_s"  # multiturn: requests of every round over the wall time, of the last
    # setting in bench.compare_tiers; serve: completed requests over the run's duration; higher is better
    GOODPUT = "goodput"  # serve: requests/s that met every bench.slo_* set; higher is better


LATENCY_OBJECTIVES = frozenset({BenchObjective.TTFT_MS, BenchObjective.TPOT_MS})
# The objectives a sweeper maximises (xrt.bench.sweep_results.direction); every other one it minimises.
THROUGHPUT_OBJECTIVES = frozenset({BenchObjective.TOKENS_PER_S, BenchObjective.OUTPUT_TOKENS_PER_S,
                                   BenchObjective.REQUESTS_PER_S, BenchObjective.GOODPUT})
# What each scenario measures (bench.objective must be one of its own, or auto).
SCENARIO_OBJECTIVES = {
    BenchScenario.LATENCY: LATENCY_OBJECTIVES,
    BenchScenario.THROUGHPUT: frozenset({BenchObjective.TOKENS_PER_S, BenchObjective.OUTPUT_TOKENS_PER_S}),
    BenchScenario.PREFIX: frozenset({BenchObjective.L2_TTFT_MS, BenchObjective.L1_TTFT_MS}),
    BenchScenario.MULTITURN: frozenset({BenchObjective.REQUESTS_PER_S}),
    BenchScenario.SERVE: LATENCY_OBJECTIVES | THROUGHPUT_OBJECTIVES,
}
AUTO_OBJECTIVES = {
    BenchScenario.LATENCY: BenchObjective.TPOT_MS,
    BenchScenario.THROUGHPUT: BenchObjective.TOKENS_PER_S,
    BenchScenario.PREFIX: BenchObjective.L2_TTFT_MS,
    BenchScenario.MULTITURN: BenchObjective.REQUESTS_PER_S,
    BenchScenario.SERVE: BenchObjective.OUTPUT_TOKENS_PER_S,  # GOODPUT when a bench.slo_* is set (objective_metric)
}


class KernelGroup(enum.Enum):
    """The comparisons of the kernels scenario."""

    ELEMENTWISE = "elementwise"  # each Triton elementwise kernel against its torch reference
    GEMV = "gemv"  # the skinny-GEMM candidates against F.linear (cuBLAS) at decode batches
    DECODE_ATTENTION = "decode_attention"  # the split-KV Triton decode attention against FlashInfer
    FLASHINFER = "flashinfer"  # FlashInfer decode through the CUDA-graph wrappers: tensor cores x split-KV
    PREFILL_EPILOGUES = "prefill_epilogues"  # the prefill's qkv and gate_up GEMMs with their epilogues fused


class ProfileMode(enum.Enum):
    BREAKDOWN = "breakdown"
    STEP = "step"
    HOST = "host"


@attrs.define
class BenchArgs:
    scenario: BenchScenario = field(
        BenchScenario.LATENCY,
        help="latency: TTFT/TPOT per batch; throughput: offline; kernels: each kernel against its reference (CUDA); "
        "prefix: TTFT by where the prefix comes from (recomputed, GPU, L1, L2 after a restart); multiturn: "
        "clients' conversations past the GPU KV, per cache.tiers setting; serve: requests over HTTP to a server "
        "(TTFT, TPOT, ITL, E2EL, throughput, goodput, as `vllm bench serve`)",
    )
    batch: list[int] = field(
        factory=lambda: [1, 2, 3, 5, 7, 8, 13, 16, 31, 47, 100],
        help="batch sizes measured (kernels: the decode batches of gemv and attention)",
        validator=each(ge(1)),
    )
    input_len: int = field(1024, help="prompt tokens per request", unit="tokens", validator=ge(1))
    output_len: int = field(256, help="generated tokens per request", unit="tokens", validator=ge(1))
    warmup: int = field(1, help="untimed repetitions before measuring", validator=ge(0))
    iters: int = field(
        3, help="timed repetitions; the median is reported, with their min-max in results.md", validator=ge(1)
    )
    peer: BenchPeer = field(
        BenchPeer.NONE, help="also run HF transformers with the same shape and weights: hf as it comes (a dynamic "
        "cache); compile: its decode step under torch.compile with a static cache (mode reduce-overhead, so CUDA "
        "graphs on CUDA), the prompt's forward eager, as transformers' own compiled generate runs; both: hf and "
        "compile in one job (our engine measured once; a record per peer and batch)",
    )
    num_requests: int = field(
        256, help="throughput scenario: requests submitted at once; serve scenario: requests sent", validator=ge(1)
    )
    min_len: int = field(100, help="throughput scenario: shortest input/output length", validator=ge(1))
    max_len: int = field(1024, help="throughput scenario: longest input/output length", validator=ge(1))
    invocations: int = field(
        1, help="throughput scenario: processes it runs in, one after another, each loading the model and taking its "
        "bench.iters timed runs; the record gives each one's tokens/s, the median and their spread, beside the "
        "spread of the timed runs (bench/NOTES.md: which of the two is larger)", validator=ge(1),
    )
    kernels: list[KernelGroup] = field(
        factory=lambda: list(KernelGroup),
        help="kernels scenario: the comparisons run (elementwise, gemv, decode_attention, flashinfer, "
        "prefill_epilogues)",
    )
    kernel_tokens: list[int] = field(
        factory=lambda: [1, 8, 64, 512],
        help="kernels scenario: token counts of the elementwise kernels and the prefill epilogues",
        validator=each(ge(1)),
    )
    context_len: list[int] = field(
        factory=lambda: [1024], help="kernels scenario: cached tokens per sequence of the decode-attention cases",
        unit="tokens", validator=each(ge(1)),
    )
    prefix_lens: list[int] = field(
        factory=lambda: [8192, 32768], help="prefix scenario: prefix lengths measured (the prompt is one token more)",
        unit="tokens", validator=each(ge(1)),
    )
    disk_probe_mb: int = field(
        2048, help="prefix scenario: size of the file that measures the L2 directory's sequential read and write "
        "bandwidth (0: no probe)", unit="MB", validator=ge(0),
    )
    clients: int = field(16, help="multiturn scenario: conversations running side by side", validator=ge(1))
    rounds: int = field(4, help="multiturn scenario: turns per conversation", validator=ge(1))
    turn_len: int = field(
        1024, help="multiturn scenario: new tokens each client appends per round (bench.output_len are generated)",
        unit="tokens", validator=ge(1),
    )
    compare_tiers: list[KVTiers] = field(
        factory=lambda: [KVTiers.GPU, KVTiers.L1_L2],
        help="multiturn scenario: the cache.tiers settings run, each on a fresh engine; ratios are against the first",
    )
    request_rate: list[float] = field(
        factory=lambda: [0.0], help="serve scenario: request rates measured, one result line each, in requests per "
        "second arriving as a gamma process of bench.burstiness (vLLM's --request-rate); 0: all at once (vLLM's "
        "inf, which a schema field cannot hold: every number here is finite)", unit="1/s", validator=each(ge(0)),
    )
    burstiness: float = field(
        1.0, help="serve scenario: the shape of the arrival intervals' gamma distribution: 1 is a Poisson process, "
        "below 1 burstier, above 1 more uniform (vLLM's --burstiness)", validator=gt(0),
    )
    max_concurrency: int = field(
        0, help="serve scenario: most requests in flight at once, the others wait in the client (vLLM's "
        "--max-concurrency); 0: no limit", validator=ge(0),
    )
    range_ratio: float = field(
        0.0, help="serve scenario: input and output lengths uniform in [len x (1 - r), len x (1 + r)] around "
        "bench.input_len and bench.output_len (vLLM's --random-range-ratio); 0: every request the same",
        validator=in_range(0, 1),
    )
    percentiles: list[float] = field(
        factory=lambda: [99.0], help="serve scenario: percentiles reported for TTFT, TPOT, ITL and E2EL, beside "
        "mean, median and standard deviation (vLLM's --metric-percentiles)",
        validator=each(in_range(0, 100, lo_open=True)),
    )
    slo_ttft_ms: float = field(
        0.0, help="serve scenario: goodput counts the requests whose TTFT is at most this (vLLM's --goodput "
        "ttft:MS); 0: no bound", unit="ms", validator=ge(0),
    )
    slo_tpot_ms: float = field(
        0.0, help="serve scenario: goodput's bound on a request's TPOT (vLLM's --goodput tpot:MS); 0: none",
        unit="ms", validator=ge(0),
    )
    slo_e2e_ms: float = field(
        0.0, help="serve scenario: goodput's bound on a request's end-to-end latency (vLLM's --goodput e2el:MS); "
        "0: none", unit="ms", validator=ge(0),
    )
    url: str = field(
        "", help="serve scenario: the server to measure, e.g. http://host:8000 (any OpenAI-compatible one that takes "
        "token-id prompts: xrt serve, vLLM); serve.api_key is sent as its key; empty: start `xrt serve` of this "
        "config in-process on a free port of 127.0.0.1",
    )
    out_dir: str = field("bench/results/latest", help="where JSON lines, the table and the plot are written "
                         "(a sweep's go under hydra.sweep.dir, by default <out_dir>/<date>_<time>)")
    objective: BenchObjective = field(
        BenchObjective.AUTO,
        help="what a job returns to a sweeper (hydra/sweeper=optuna optimises it): ttft_ms, tpot_ms (latency: "
        "mean over bench.batch), tokens_per_s, output_tokens_per_s (throughput), l2_ttft_ms, l1_ttft_ms (prefix: "
        "mean over bench.prefix_lens), requests_per_s (multiturn: the last of bench.compare_tiers), goodput "
        "(serve; serve also measures ttft_ms, tpot_ms, tokens_per_s, output_tokens_per_s, requests_per_s); auto: "
        "tpot_ms, tokens_per_s, l2_ttft_ms, requests_per_s, or for serve goodput with a bench.slo_* set, else "
        "output_tokens_per_s",
    )

    @property
    def has_slo(self) -> bool:
        """A goodput bound is set (xrt.bench.serve_metrics.slos_ms: which)."""
        return any(bound > 0 for bound in (self.slo_ttft_ms, self.slo_tpot_ms, self.slo_e2e_ms))

    def objective_metric(self) -> BenchObjective | None:
        """The objective this scenario measures (auto resolved); None for the kernels scenario."""
        if self.objective is not BenchObjective.AUTO:
            return self.objective
        if self.scenario is BenchScenario.SERVE and self.has_slo:
            return BenchObjective.GOODPUT
        return AUTO_OBJECTIVES.get(self.scenario)

    def check(self) -> Problems:
        problems: Problems = []
        if self.min_len > self.max_len:
            problems.append(("min_len", f"must be <= max_len={self.max_len}, got {self.min_len}"))
        if not self.prefix_lens:
            problems.append(("prefix_lens", "must list at least one prefix length, got []"))
        if not self.request_rate:
            problems.append(("request_rate", "must list at least one rate (0: all at once), got []"))
        if not self.compare_tiers:
            problems.append(("compare_tiers", "must list at least one cache.tiers setting (gpu, l1, l1_l2), got []"))
        elif len(set(self.compare_tiers)) < len(self.compare_tiers):
            twice = sorted({t.value for t in self.compare_tiers if self.compare_tiers.count(t) > 1})
            problems.append(("compare_tiers", f"lists {', '.join(twice)} more than once, got "
                                              f"[{', '.join(t.value for t in self.compare_tiers)}]"))
        if self.objective is BenchObjective.GOODPUT and not self.has_slo:
            problems.append(("objective", "goodput needs a bound: set bench.slo_ttft_ms, slo_tpot_ms or slo_e2e_ms"))
        measured = SCENARIO_OBJECTIVES
        if self.objective is not BenchObjective.AUTO and self.objective not in measured.get(self.scenario, ()):
            fits = sorted(o.value for o in measured.get(self.scenario, ()))
            which = f"one of {', '.join(fits)} or auto" if fits else "auto (the kernels scenario returns none)"
            problems.append(("objective", f"the {self.scenario.value} scenario does not measure "
                                          f"{self.objective.value}; expected {which}"))
        return problems


@attrs.define
class ProfileArgs:
    mode: ProfileMode = field(
        ProfileMode.BREAKDOWN,
        help="breakdown: GPU time per kernel of a prefill and of back-to-back decode graph replays (CUDA); "
        "step: host vs device time of prefill and decode steps and the top ops; "
        "host: the engine's host cost per decode step against a stand-in runner (no model)",
    )
    batch: list[int] = field(factory=lambda: [1, 8, 100], help="batch sizes profiled", validator=each(ge(1)))
    input_len: int = field(
        1024, help="tokens per sequence: the prompt prefilled, then the decode context", unit="tokens",
        validator=ge(1),
    )
    iters: int = field(50, help="timed repetitions: decode graph replays, prefill or engine steps", validator=ge(1))
    warmup: int = field(3, help="untimed repetitions before timing", validator=ge(0))
    rows: int = field(20, help="rows of each per-kernel / per-op table (0: no tables)", validator=ge(0))

    def check(self) -> Problems:
        return [("batch", "must list at least one batch size, got []")] if not self.batch else []
