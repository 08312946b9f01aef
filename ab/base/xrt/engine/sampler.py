"""Batched sampling over float32 logits: greedy rows (temperature 0) take the argmax; the others are
scaled by temperature, cut to top-k then top-p over the sorted distribution, and drawn with their
request's own seeded generator, so a request's tokens do not depend on what it is batched with."""

from __future__ import annotations

import torch

from xrt.config import SamplingArgs


def sample(
    logits: torch.Tensor,
    params: list[SamplingArgs],
    generators: list[torch.Generator | None],
    argmax: torch.Tensor | None = None,
) -> list[int]:
    """logits [N, V]; one SamplingArgs and one generator (on logits' device; None for greedy rows) per row.
    argmax: the greedy token of every row when the executor already computed it (never written to)."""
    logits = logits.float()
    tokens = logits.argmax(dim=-1) if argmax is None else argmax
    rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if rows:
        tokens = tokens.clone()
        probs, order = _filtered_probs(logits[rows], [params[i] for i in rows])
        for j, i in enumerate(rows):
            choice = torch.multinomial(probs[j], 1, generator=generators[i])
            tokens[i] = order[j, choice[0]]
    return tokens.tolist()


def _filtered_probs(logits: torch.Tensor, params: list[SamplingArgs]) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities in descending order (zero outside top-k / top-p) and the token id of each column."""
    n, vocab = logits.shape
    device = logits.device
    # At least float32's smallest normal: a smaller temperature would round to 0 on the device (0 / 0: NaN).
    tiny = torch.finfo(torch.float32).tiny
    temperature = torch.tensor([max(p.temperature, tiny) for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
    # top_p == 1 keeps everything; comparing cumulative sums to 1.0 would drop tail tokens to rounding.
    top_p = torch.tensor([p.top_p if p.top_p < 1.0 else float("inf") for p in params], device=device)
    # Shifted so each row's largest logit is 0 before scaling: a tiny temperature then drives the others to
    # -inf (probability 0) instead of overflowing the top ones to inf (inf - inf: NaN in softmax).
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    ordered, order = (shifted / temperature[:, None]).sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=device)
    ordered = ordered.masked_fill(rank[None, :] >= top_k[:, None], float("-inf"))
    probs = ordered.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < top_p. The
    # most likely token always stays (a top_p below float32's smallest value rounds to 0 on the device).
    probs = probs.masked_fill((mass_before >= top_p[:, None]) & (rank[None, :] > 0), 0.0)
    return probs, order
