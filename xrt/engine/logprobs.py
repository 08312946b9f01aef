"""Log-probabilities of the sampled tokens (`sampling.logprobs`): the float32 log-softmax of the raw logits a step
returned, before temperature, top-k and top-p (vLLM's default "raw_logprobs"), so the numbers describe the model,
not the sampling settings. Computed only for the rows that ask; a step where none asks costs nothing."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its logprob, its rank among the vocabulary (1: the most likely; 1 + the number of tokens
    with a strictly larger logprob) and the request's `sampling.logprobs` most likely (token id, logprob), descending
    (empty with logprobs=0). The sampled token may or may not be among them."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


def token_logprobs(logits: torch.Tensor, tokens: list[int], ks: list[int | None]) -> list[TokenLogprob | None]:
    """logits [N, V] (one row per sampled sequence), the token sampled from each row, and each row's
    `sampling.logprobs` (None: the row asks for nothing, and gets None)."""
    rows = [i for i, k in enumerate(ks) if k is not None]
    out: list[TokenLogprob | None] = [None] * len(ks)
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    lp = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    chosen_ids = torch.tensor([tokens[i] for i in rows], device=logits.device)
    chosen = lp.gather(1, chosen_ids[:, None])
    ranks = (lp > chosen).sum(dim=-1) + 1
    k_max = min(max(k for k in ks if k is not None), lp.shape[-1])
    top_lp, top_ids = lp.topk(k_max, dim=-1) if k_max else (lp[:, :0], lp[:, :0].long())
    # One device-to-host copy per tensor for the whole step, not one per row.
    chosen_l, ranks_l = chosen.squeeze(1).tolist(), ranks.tolist()
    top_lp_l, top_ids_l = top_lp.tolist(), top_ids.tolist()
    for j, i in enumerate(rows):
        k = ks[i]
        assert k is not None
        top = list(zip(top_ids_l[j][:k], top_lp_l[j][:k], strict=True))
        out[i] = TokenLogprob(tokens[i], chosen_l[j], ranks_l[j], top)
    return out
