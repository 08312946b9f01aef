"""tp=2 against tp=1 on a transformers-written checkpoint with one KV head (each of the two ranks holds a
replica of it), tied embeddings, eager, float32 over gloo. One spawned pair of ranks for the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from shape_checks import check_generation, check_parity, config
from tp_helpers import tp_workers, write_checkpoint

from xrt.distributed.driver import TPRunner
from xrt.engine.llm import LLM
from xrt.executor.runner import ModelRunner


@pytest.fixture(scope="module")
def one_kv_head(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: str) -> Iterator[tuple[str, TPRunner]]:
    path = write_checkpoint(str(tmp_path_factory.mktemp("one_kv_head")), tiny_checkpoint, vocab_size=2048,
                            num_kv_heads=1, tied=True, seed=6)
    tp = TPRunner(config(path, 2))
    yield path, tp
    tp.close()
    assert not tp_workers()


def test_one_kv_head_is_replicated_on_both_ranks(one_kv_head: tuple[str, TPRunner]) -> None:
    path, tp = one_kv_head
    attn = tp.local.attention_layers[0]
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
    assert tp.local.model.lm_head.weight is tp.local.model.model.embed_tokens.weight
    ref = ModelRunner(config(path, 1))
    check_parity(ref, tp, 2048)
    check_generation(LLM(config(path, 1), runner=ref), LLM(config(path, 2), runner=tp), 2048)
