from __future__ import annotations

import re

import pytest
import torch

from xrt.config import SamplingArgs
from xrt.engine.sampler import sample

V = 50


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def logits_rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, V, generator=gen(seed)) * 2.0


def test_greedy_is_argmax() -> None:
    logits = logits_rows(6)
    tokens = sample(logits, [SamplingArgs(temperature=0.0)] * 6, [None] * 6)
    assert tokens == logits.argmax(dim=-1).tolist()


def test_greedy_rows_are_unaffected_by_sampled_rows() -> None:
    logits = logits_rows(4)
    params = [SamplingArgs(), SamplingArgs(temperature=1.0), SamplingArgs(), SamplingArgs(temperature=2.0)]
    tokens = sample(logits, params, [None, gen(1), None, gen(2)])
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())


def test_top_k_never_leaves_the_top_k() -> None:
    logits = logits_rows(1, seed=3)
    allowed = set(logits[0].topk(5).indices.tolist())
    g = gen(0)
    seen = set()
    for _ in range(400):
        (t,) = sample(logits, [SamplingArgs(temperature=1.5, top_k=5)], [g])
        seen.add(t)
    assert seen <= allowed
    assert len(seen) == 5  # high temperature: every one of the k shows up


def test_top_p_keeps_the_smallest_set_reaching_p_and_its_proportions() -> None:
    probs = torch.tensor([0.5, 0.25, 0.15, 0.06, 0.04] + [0.0] * (V - 5))
    logits = torch.log(probs.clamp_min(1e-12))[None, :]
    g = gen(0)
    draws = 4000
    counts = torch.zeros(V)
    for _ in range(draws):
        (t,) = sample(logits, [SamplingArgs(temperature=1.0, top_p=0.8)], [g])
        counts[t] += 1
    # 0.5 + 0.25 < 0.8 <= 0.5 + 0.25 + 0.15: exactly the first three tokens, renormalised.
    assert counts[3:].sum() == 0
    expected = probs[:3] / probs[:3].sum()
    assert torch.allclose(counts[:3] / draws, expected, atol=0.03)


def test_top_p_one_keeps_every_token() -> None:
    logits = torch.zeros(1, 4)
    g = gen(0)
    seen = {sample(logits, [SamplingArgs(temperature=1.0, top_p=1.0)], [g])[0] for _ in range(200)}
    assert seen == {0, 1, 2, 3}


def test_same_seed_same_tokens_regardless_of_batch() -> None:
    logits = logits_rows(3, seed=7)
    p = SamplingArgs(temperature=1.0, top_p=0.9, top_k=20)

    def draw(rows: torch.Tensor, seed: int, n: int = 30) -> list[int]:
        g = gen(seed)
        out = []
        for _ in range(n):
            out.append(sample(rows, [p] * rows.shape[0], [g if i == 0 else gen(99) for i in range(rows.shape[0])])[0])
        return out

    alone = draw(logits[:1], seed=5)
    batched = draw(logits, seed=5)
    assert alone == batched
    assert draw(logits[:1], seed=6) != alone


def test_temperature_sharpens_towards_argmax() -> None:
    logits = logits_rows(1, seed=11)
    g = gen(0)
    cold = [sample(logits, [SamplingArgs(temperature=0.01)], [g])[0] for _ in range(50)]
    assert set(cold) == {int(logits.argmax())}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("top_p", 0.0, "must be in (0.0, 1.0]"), ("temperature", -0.5, "must be >= 0"), ("top_k", -1, "must be >= 0")],
)
def test_impossible_sampling_values_are_rejected(field: str, value: float, expected: str) -> None:
    with pytest.raises(ValueError, match=re.escape(expected)):
        SamplingArgs(**{field: value})


def test_precomputed_argmax_is_used_for_greedy_rows_and_left_untouched() -> None:
    logits = logits_rows(3)
    given = torch.tensor([7, 8, 9])  # not the argmax: proves the sampler takes it as is
    params = [SamplingArgs(), SamplingArgs(temperature=1.0), SamplingArgs()]
    tokens = sample(logits, params, [None, gen(1), None], argmax=given)
    assert tokens[0] == 7 and tokens[2] == 9 and tokens[1] != 8
    assert given.tolist() == [7, 8, 9]
