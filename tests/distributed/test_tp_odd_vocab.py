"""tp=2 against tp=1 on a transformers-written checkpoint whose vocabulary tp does not divide (2051: the last
rank's shard is padded and the padding cut off the gathered logits), untied embeddings, float32 over gloo,
served through decode graphs on CPU (RerunCapture): the engine's overlapped `launch_decode` path runs on every
rank, rows reading their token from the previous launch. One spawned pair of ranks for the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from shape_checks import check_generation, check_parity, config, prompts
from tp_helpers import tp_workers, write_checkpoint

from xrt.config import SamplingArgs
from xrt.distributed.driver import TPRunner
from xrt.engine.llm import LLM
from xrt.executor.graphs.capture import RerunCapture
from xrt.executor.runner import ModelRunner


@pytest.fixture(scope="module")
def odd_vocab(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: str) -> Iterator[tuple[str, TPRunner]]:
    path = write_checkpoint(str(tmp_path_factory.mktemp("odd_vocab")), tiny_checkpoint, vocab_size=2051,
                            num_kv_heads=2, tied=False, seed=5)
    tp = TPRunner(config(path, 2, graphs=True), capture=RerunCapture())
    yield path, tp
    tp.close()
    assert not tp_workers()


def test_odd_vocabulary_pads_the_last_shard(odd_vocab: tuple[str, TPRunner]) -> None:
    path, tp = odd_vocab
    head = tp.local.model.lm_head
    assert (head.num_embeddings, head.weight.shape[0], head.vocab_start) == (2051, 1026, 0)
    assert tp.decode_capacity == 8
    check_parity(ModelRunner(config(path, 1)), tp, 2051)


def test_odd_vocabulary_greedy_through_overlapped_graph_launches(odd_vocab: tuple[str, TPRunner]) -> None:
    path, tp = odd_vocab
    launches = []
    launch = tp.launch_decode

    def counted(batch, after):  # noqa: ANN001, ANN202
        launches.append(after is not None)
        return launch(batch, after)

    tp.launch_decode = counted  # type: ignore[method-assign]
    try:
        # The engine's config is eager (CPU), its runner the graph one: the engine overlaps its launches.
        check_generation(LLM(config(path, 1)), LLM(config(path, 2), runner=tp), 2051)
    finally:
        del tp.launch_decode
    assert launches and any(launches)  # launched steps, some reading the previous launch's tokens




def test_logprobs_over_two_ranks_equal_one_rank(odd_vocab: tuple[str, TPRunner]) -> None:
    """Rank 0 has the whole gathered vocabulary (padding cut): logprobs, ranks and top-k as one rank's, the padded
    ids never among them; the requests without logprobs beside them get none."""
    path, tp = odd_vocab
    batch = prompts(6, seed=5, vocab=2051)
    sampling = [SamplingArgs(max_tokens=5, ignore_eos=True, logprobs=5 if i % 2 else None) for i in range(6)]
    with LLM(config(path, 1)) as one:
        want = one.generate(batch, sampling)
    got = LLM(config(path, 2), runner=tp).generate(batch, sampling)  # not closed: the module's ranks
    for w, g, s in zip(want, got, sampling, strict=True):
        assert g.token_ids == w.token_ids
        if s.logprobs is None:
            assert g.logprobs is None
            continue
        assert g.logprobs is not None and w.logprobs is not None and len(g.logprobs) == len(g.token_ids)
        for a, b in zip(g.logprobs, w.logprobs, strict=True):
            assert (a.token_id, a.rank) == (b.token_id, b.rank)
            assert [t for t, _ in a.top] == [t for t, _ in b.top] and all(t < 2051 for t, _ in a.top)
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-4)
