"""The benchmark and profiling sections of the schema (`bench.*`, `profile.*`)."""

from __future__ import annotations

import enum

import attrs

from xrt.config.problems import Problems
from xrt.reflect import each, field, ge


class BenchPeer(enum.Enum):
    NONE = "none"
    HF = "hf"


class BenchScenario(enum.Enum):
    LATENCY = "latency"
    THROUGHPUT = "throughput"
    KERNELS = "kernels"
    PREFIX = "prefix"  # TTFT by where a prompt's prefix comes from: recomputed, GPU pages, L1, L2 after a restart
    MULTITURN = "multiturn"  # clients' conversations whose KV outgrows the GPU pages, per cache.tiers setting


class BenchObjective(enum.Enum):
    """What a bench job returns to Hydra's sweeper (Optuna optimises it; every sweep reports its best job)."""

    AUTO = "auto"  # latency: tpot_ms; throughput: tokens_per_s; prefix: l2_ttft_ms; multiturn: requests_per_s;
    # kernels: none
    TTFT_MS = "ttft_ms"  # latency, mean over bench.batch (one batch: TTFT at that batch); lower is better
    TPOT_MS = "tpot_ms"  # latency, as ttft_ms
    TOKENS_PER_S = "tokens_per_s"  # throughput, input and output tokens; higher is better
    OUTPUT_TOKENS_PER_S = "output_tokens_per_s"  # throughput, output tokens only
    L2_TTFT_MS = "l2_ttft_ms"  # prefix: TTFT of a new engine whose prompt's prefix is in L2, mean over prefix_lens
    L1_TTFT_MS = "l1_ttft_ms"  # prefix: TTFT with the prefix in L1 (GPU prefix cache evicted), as l2_ttft_ms
    REQUESTS_PER_S = "requests_per_s"  # multiturn: requests of every round over the wall time, of the last
    # setting in bench.compare_tiers; higher is better


LATENCY_OBJECTIVES = frozenset({BenchObjective.TTFT_MS, BenchObjective.TPOT_MS})
# The objectives a sweeper maximises (xrt.bench.sweep_results.direction); every other one it minimises.
THROUGHPUT_OBJECTIVES = frozenset({BenchObjective.TOKENS_PER_S, BenchObjective.OUTPUT_TOKENS_PER_S,
                                   BenchObjective.REQUESTS_PER_S})
# What each scenario measures (bench.objective must be one of its own, or auto).
SCENARIO_OBJECTIVES = {
    BenchScenario.LATENCY: LATENCY_OBJECTIVES,
    BenchScenario.THROUGHPUT: frozenset({BenchObjective.TOKENS_PER_S, BenchObjective.OUTPUT_TOKENS_PER_S}),
    BenchScenario.PREFIX: frozenset({BenchObjective.L2_TTFT_MS, BenchObjective.L1_TTFT_MS}),
    BenchScenario.MULTITURN: frozenset({BenchObjective.REQUESTS_PER_S}),
}
AUTO_OBJECTIVES = {
    BenchScenario.LATENCY: BenchObjective.TPOT_MS,
    BenchScenario.THROUGHPUT: BenchObjective.TOKENS_PER_S,
    BenchScenario.PREFIX: BenchObjective.L2_TTFT_MS,
    BenchScenario.MULTITURN: BenchObjective.REQUESTS_PER_S,
}


class KernelGroup(enum.Enum):
    """The comparisons of the kernels scenario."""

    ELEMENTWISE = "elementwise"  # each Triton elementwise kernel against its torch reference
    GEMV = "gemv"  # the skinny-GEMM candidates against F.linear (cuBLAS) at decode batches
    DECODE_ATTENTION = "decode_attention"  # the split-KV Triton decode attention against FlashInfer
    FLASHINFER = "flashinfer"  # FlashInfer decode through the CUDA-graph wrappers: tensor cores x split-KV


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
        "clients' conversations past the GPU KV, per cache.tiers setting",
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
    peer: BenchPeer = field(BenchPeer.NONE, help="hf: also run HF transformers with the same shape and weights")
    num_requests: int = field(256, help="throughput scenario: requests submitted at once", validator=ge(1))
    min_len: int = field(100, help="throughput scenario: shortest input/output length", validator=ge(1))
    max_len: int = field(1024, help="throughput scenario: longest input/output length", validator=ge(1))
    kernels: list[KernelGroup] = field(
        factory=lambda: list(KernelGroup),
        help="kernels scenario: the comparisons run (elementwise, gemv, decode_attention, flashinfer)",
    )
    kernel_tokens: list[int] = field(
        factory=lambda: [1, 8, 64, 512], help="kernels scenario: token counts of the elementwise kernels",
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
    out_dir: str = field("bench/results/latest", help="where JSON lines, the table and the plot are written "
                         "(a sweep's go under hydra.sweep.dir, by default <out_dir>/<date>_<time>)")
    objective: BenchObjective = field(
        BenchObjective.AUTO,
        help="what a job returns to a sweeper (hydra/sweeper=optuna optimises it): ttft_ms, tpot_ms (latency: "
        "mean over bench.batch), tokens_per_s, output_tokens_per_s (throughput), l2_ttft_ms, l1_ttft_ms (prefix: "
        "mean over bench.prefix_lens), requests_per_s (multiturn: the last of bench.compare_tiers); auto: "
        "tpot_ms, tokens_per_s, l2_ttft_ms or requests_per_s",
    )

    def objective_metric(self) -> BenchObjective | None:
        """The objective this scenario measures (auto resolved); None for the kernels scenario."""
        if self.objective is not BenchObjective.AUTO:
            return self.objective
        return AUTO_OBJECTIVES.get(self.scenario)

    def check(self) -> Problems:
        problems: Problems = []
        if self.min_len > self.max_len:
            problems.append(("min_len", f"must be <= max_len={self.max_len}, got {self.min_len}"))
        if not self.prefix_lens:
            problems.append(("prefix_lens", "must list at least one prefix length, got []"))
        if not self.compare_tiers:
            problems.append(("compare_tiers", "must list at least one cache.tiers setting (gpu, l1, l1_l2), got []"))
        elif len(set(self.compare_tiers)) < len(self.compare_tiers):
            twice = sorted({t.value for t in self.compare_tiers if self.compare_tiers.count(t) > 1})
            problems.append(("compare_tiers", f"lists {', '.join(twice)} more than once, got "
                                              f"[{', '.join(t.value for t in self.compare_tiers)}]"))
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


# KVTiers (bench.compare_tiers) lives in schema.py, which imports this module before defining it: bound here, once
# every class above exists, so BenchArgs' annotations (resolved when a config is built) and its default find it.
from xrt.config.schema import KVTiers  # noqa: E402
