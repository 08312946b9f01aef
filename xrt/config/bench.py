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


@attrs.define
class BenchArgs:
    scenario: BenchScenario = field(BenchScenario.LATENCY, help="latency: TTFT/TPOT per batch; throughput: offline")
    batch: list[int] = field(
        factory=lambda: [1, 2, 3, 5, 7, 8, 13, 16, 31, 47, 100], help="batch sizes measured", validator=each(ge(1))
    )
    input_len: int = field(1024, help="prompt tokens per request", unit="tokens", validator=ge(1))
    output_len: int = field(256, help="generated tokens per request", unit="tokens", validator=ge(1))
    warmup: int = field(1, help="untimed repetitions before measuring", validator=ge(0))
    iters: int = field(3, help="timed repetitions; the median is reported", validator=ge(1))
    peer: BenchPeer = field(BenchPeer.NONE, help="hf: also run HF transformers with the same shape and weights")
    num_requests: int = field(256, help="throughput scenario: requests submitted at once", validator=ge(1))
    min_len: int = field(100, help="throughput scenario: shortest input/output length", validator=ge(1))
    max_len: int = field(1024, help="throughput scenario: longest input/output length", validator=ge(1))
    out_dir: str = field("bench/results/latest", help="where JSON lines, the table and the plot are written")

    def check(self) -> Problems:
        if self.min_len > self.max_len:
            return [("min_len", f"must be <= max_len={self.max_len}, got {self.min_len}")]
        return []


@attrs.define
class ProfileArgs:
    batch: list[int] = field(factory=lambda: [1], help="batch sizes profiled", validator=each(ge(1)))
