"""tp=2 against tp=1 on a transformers-written checkpoint whose vocabulary tp does not divide (2051: the last
rank's shard is padded and the padding cut off the gathered logits), untied embeddings, float32 over gloo,
served through decode graphs on CPU (RerunCapture): the engine's overlapped `launch_decode` path runs on every
rank, rows reading their token from the previous launch. One spawned pair of ranks for the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from shape_checks import check_generation, check_parity, config
from tp_helpers import tp_workers, write_checkpoint

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


