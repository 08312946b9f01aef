"""Prompts checked against the config before a model loads: what `LLMEngine.check_request` finds without a
runner (not text or token ids, invalid text, token ids past the vocabulary, text with no tokenizer to encode it,
empty, too long for model.max_model_len or the prefill budget), for every prompt at once, so a bad line of a
prompts file fails in a second, with every other bad line, not after the weights load. What needs the KV cache's
size (a prompt longer than the cache) is still found by `check_request` once the runner is up."""

from __future__ import annotations

from xrt.config import XrtConfig
from xrt.engine.errors import RequestError
from xrt.engine.scheduler import length_error
from xrt.engine.tokenizer import Tokenizer, checkpoint_tokenizer
from xrt.engine.validate_prompts import check_prompt, no_tokenizer


def config_tokenizer(cfg: XrtConfig) -> tuple[Tokenizer | None, str | None]:
    """The tokenizer of the checkpoint cfg names (made first, for the tiny model) and its directory; None, None for
    dummy weights. Hand the tokenizer to `LLM(cfg, tokenizer=...)`: it is not read twice."""
    from xrt.models.checkpoint import resolve_checkpoint

    checkpoint_dir = resolve_checkpoint(cfg.model)
    return checkpoint_tokenizer(checkpoint_dir, cfg.chat), checkpoint_dir


def checkpoint_problems(cfg: XrtConfig) -> list[tuple[str, str]]:
    """Why the checkpoint cfg names cannot be resolved (no model.path for a model that needs one, a cache
    directory the tiny checkpoint cannot be made in), found before anything is made or loaded."""
    from xrt.models.checkpoint import checkpoint_problem

    line = checkpoint_problem(cfg.model)
    if line is None:
        return []
    field, sep, message = line.partition(": ")
    return [(field, message)] if sep and field == "model.path" else [("", line)]


def precheck_prompts(
    prompts: list[object], cfg: XrtConfig, tokenizer: Tokenizer | None, checkpoint_dir: str | None, *,
    add_special_tokens: bool = True,
) -> list[RequestError]:
    """Every prompt's problem (`prompts[i]: ...`, index set), in prompt order; [] when all can be queued."""
    found: list[RequestError] = []
    for i, prompt in enumerate(prompts):
        where = f"prompts[{i}]"
        try:
            checked = check_prompt(prompt, where, cfg.model.vocab_size, i)
        except RequestError as e:
            found.append(e)
            continue
        if isinstance(checked, str):
            if tokenizer is None:
                found.append(RequestError(where, no_tokenizer(checkpoint_dir), i))
                continue
            checked = tokenizer.encode(checked, add_special_tokens=add_special_tokens)
        error = length_error(len(checked), cfg.model.max_model_len, cfg.scheduler)
        if error is not None:
            found.append(RequestError(where, error, i))
    return found


__all__ = ["checkpoint_problems", "config_tokenizer", "precheck_prompts"]
