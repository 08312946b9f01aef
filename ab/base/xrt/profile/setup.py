"""What every profile mode shares: its copy of the config, the report's header, fresh prefill steps."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

import torch

from xrt.bench.environment import environment
from xrt.bench.setup import BenchError, bench_config
from xrt.config import BenchScenario, Device, XrtConfig
from xrt.executor.step import SeqChunk, StepInput

Emit = Callable[[str], None]


def profile_config(cfg: XrtConfig, extra_tokens: int) -> XrtConfig:
    """The bench's adjustments for the profiled shape: every batch prefills in one step and input_len +
    extra_tokens fit max_model_len."""
    c = copy.deepcopy(cfg)
    p = c.profile
    c.bench.scenario = BenchScenario.LATENCY
    c.bench.batch = list(p.batch)
    c.bench.input_len = p.input_len
    c.bench.output_len = extra_tokens
    try:
        return bench_config(c)
    except BenchError as e:
        named = str(e).replace("bench.input_len + bench.output_len", f"profile.input_len + {extra_tokens} steps")
        raise BenchError(named.replace("bench.batch", "profile.batch")) from None


def require_cuda(cfg: XrtConfig) -> None:
    if cfg.device is Device.CPU or not torch.cuda.is_available():
        raise BenchError(f"profile.mode: {cfg.profile.mode.value} needs a CUDA device, and none is available "
                         f"(profile.mode=host and step run on CPU)")


def header(title: str, device: torch.device, cfg: XrtConfig) -> str:
    env = environment(device)
    return (f"# xrt profile: {title}\n\n{cfg.model.name}, executor {cfg.executor.kind.value}, "
            f"{env['device_name']}, torch {env['torch']}, commit {env['git_commit']}")


def fresh_prefill(batch: int, input_len: int, page_size: int, num_pages: int, vocab: int, rng: random.Random,
                  extra_tokens: int = 1) -> StepInput:
    """`batch` fresh sequences of input_len random tokens on disjoint pages (room for extra_tokens more)."""
    per_seq = -(-(input_len + extra_tokens) // page_size)
    if batch * per_seq > num_pages:
        raise BenchError(f"profile.batch: {batch} sequences of {input_len} tokens need {batch * per_seq} KV pages, "
                         f"the cache has {num_pages}")
    return StepInput(True, [
        SeqChunk([rng.randrange(vocab) for _ in range(input_len)], 0, list(range(i * per_seq, (i + 1) * per_seq)))
        for i in range(batch)
    ])
