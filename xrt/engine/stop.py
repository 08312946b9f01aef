"""When a sequence stops after a new token: end-of-sequence ids and stop strings ("stop"), max_tokens
("length"), model.max_model_len ("context_length"). The scheduler ends the rest ("kv_cache")."""

from __future__ import annotations

from xrt.engine.sequence import Sequence


def truncate_at_stop(text: str, stops: list[str], new_from: int) -> int | None:
    """Index of the earliest stop string that ends in text[new_from:], or None."""
    best: int | None = None
    for stop in stops:
        if not stop:
            continue
        i = text.find(stop, max(0, new_from - len(stop) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def stop_holdback(text: str, stops: list[str]) -> int:
    """How many characters at the end of text could be the start of a stop string (the longest suffix that is a
    proper prefix of one): a stream holds them back until the next tokens show whether the stop string follows,
    because if it does, the text ends before it."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


def finish_reason(seq: Sequence, delta: str, eos_token_ids: list[int], max_model_len: int) -> str | None:
    """Checks the newest token of seq (and the text it added, `delta`); trims seq.text at a stop string."""
    sampling = seq.sampling
    if sampling.stop and delta:
        i = truncate_at_stop(seq.text, sampling.stop, len(seq.text) - len(delta))
        if i is not None:
            seq.text = seq.text[:i]
            return "stop"
    if not sampling.ignore_eos and seq.token_ids[-1] in eos_token_ids:
        return "stop"
    n = len(seq.token_ids)  # not the properties: this runs for every generated token
    # max_tokens first: a request that got all it asked for ended by its own limit, even at the context's.
    if n - len(seq.prompt_token_ids) >= sampling.max_tokens:
        return "length"
    if n >= max_model_len:
        return "context_length"
    return None
