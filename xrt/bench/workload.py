"""Seeded synthetic requests: random token ids, so no tokenizer or dataset is needed and every
run of the same seed sees the same shapes."""

from __future__ import annotations

import numpy as np

from xrt.config import XrtConfig

# Warm-up repetitions draw their ids from here on, apart from the timed ones (0, 1, ...).
WARMUP_REP = 1 << 20


def random_prompts(vocab_size: int, batch: int, input_len: int, seed: int, rep: int) -> list[list[int]]:
    """`batch` prompts of `input_len` ids. `rep` varies the ids between repetitions so a prefix cache
    never turns a timed prefill into a lookup."""
    rng = np.random.default_rng([seed, batch, input_len, rep])
    return rng.integers(0, vocab_size, size=(batch, input_len)).tolist()


def batch_prompts(cfg: XrtConfig, batch: int, rep: int) -> list[list[int]]:
    """The latency scenario's prompts for one repetition of one batch."""
    return random_prompts(cfg.model.vocab_size, batch, cfg.bench.input_len, cfg.seed, rep)


def random_lengths(num: int, min_len: int, max_len: int, seed: int) -> list[tuple[int, int]]:
    """(input_len, output_len) per request, each uniform in [min_len, max_len]."""
    rng = np.random.default_rng([seed, num, min_len, max_len])
    return [(int(i), int(o)) for i, o in rng.integers(min_len, max_len + 1, size=(num, 2))]


def prompts_of_lengths(vocab_size: int, lengths: list[int], seed: int, rep: int) -> list[list[int]]:
    rng = np.random.default_rng([seed, len(lengths), rep, 1])
    return [rng.integers(0, vocab_size, size=n).tolist() for n in lengths]


def around(num: int, center: int, ratio: float, rng: np.random.Generator) -> list[int]:
    """`num` lengths uniform in [center x (1 - ratio), center x (1 + ratio)], at least 1 (vLLM's random dataset)."""
    lo, hi = max(1, int(center * (1 - ratio))), max(1, int(center * (1 + ratio)))
    return [int(n) for n in rng.integers(lo, hi + 1, size=num)]


def serve_lengths(cfg: XrtConfig) -> tuple[list[int], list[int]]:
    """The serve scenario's (input lengths, output lengths), one each per request."""
    b = cfg.bench
    rng = np.random.default_rng([cfg.seed, b.num_requests, b.input_len, b.output_len, 3])
    return around(b.num_requests, b.input_len, b.range_ratio, rng), around(b.num_requests, b.output_len,
                                                                          b.range_ratio, rng)


def arrival_offsets(num: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds from the start at which each request is sent. rate 0: all at once. Else the intervals are drawn from
    a gamma distribution of shape `burstiness` and mean 1 / rate, summed, and scaled so the last request goes at
    num / rate exactly: vLLM's `get_request` does so, because the bare sum strays 1-2% from it by seed, and so would
    the throughput measured at a fixed rate."""
    if rate <= 0:
        return [0.0] * num
    rng = np.random.default_rng([seed, num, 5])
    offsets = np.cumsum(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num))
    return (offsets * (num / rate / offsets[-1])).tolist()
