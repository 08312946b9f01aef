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
