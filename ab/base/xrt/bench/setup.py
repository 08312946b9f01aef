"""The bench's own copy of the config: limits raised so the measured shape fits."""

from __future__ import annotations

import copy

from xrt.config import BenchScenario, ExecutorArgs, ExecutorKind, XrtConfig
from xrt.executor.buckets import Buckets

TINY_MODEL = "qwen3-tiny"
CPU_RUN = "model=qwen3-tiny model.dtype=float32 bench.input_len=8 bench.output_len=4 bench.batch=[1,2]"


class BenchError(ValueError):
    """A bench setting that cannot be measured; the message is one line naming the field."""


def bench_config(cfg: XrtConfig) -> XrtConfig:
    """Latency: the whole batch prefills in one step (token budget and sequence count fit the largest
    batch), and prompt + output fit max_model_len. Throughput: the longest request fits max_model_len."""
    c = copy.deepcopy(cfg)
    b = c.bench
    if b.scenario is BenchScenario.LATENCY:
        if not b.batch:
            raise BenchError("bench.batch: must list at least one batch size, got []")
        need = b.input_len + b.output_len
        field = "bench.input_len + bench.output_len"
        c.scheduler.max_num_seqs = max(c.scheduler.max_num_seqs, max(b.batch))
        c.scheduler.max_batched_tokens = max(c.scheduler.max_batched_tokens, max(b.batch) * b.input_len)
    else:
        need = 2 * b.max_len
        field = "2 * bench.max_len"
    if need > c.model.max_position_embeddings:
        raise BenchError(f"{field}: must be <= model.max_position_embeddings={c.model.max_position_embeddings}, "
                         f"got {need}")
    c.model.max_model_len = max(c.model.max_model_len, need)
    return c


def decode_bucket(ex: ExecutorArgs, batch: int) -> int | None:
    """The CUDA-graph bucket a decode batch pads to; None for eager or a batch over the largest."""
    if ex.kind is not ExecutorKind.CUDAGRAPH:
        return None
    return Buckets.from_args(ex).bucket_for(batch)


def cpu_warning(cfg: XrtConfig, device_type: str) -> str | None:
    """One line for `xrt bench` on a CPU with any model but the tiny one: conf/bench.yaml's protocol (Qwen3-0.6B,
    input 1024, output 256, batches up to 100) is sized for a GPU and would take hours there. None otherwise."""
    if device_type != "cpu" or cfg.model.name == TINY_MODEL or cfg.bench.scenario is BenchScenario.KERNELS:
        return None
    return (f"bench on a CPU: the benchmark protocol (model {cfg.model.name}) is sized for a GPU and may take hours "
            f"here; for a CPU run use model={TINY_MODEL}, e.g. `python -m xrt bench {CPU_RUN}`")
