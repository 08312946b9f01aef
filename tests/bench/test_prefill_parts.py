"""profile.mode=step's prefill step part by part (xrt.profile.prefill_parts), on CPU: the CUDA-graph runner's parts
with "graphs" that re-run (RerunCapture over the torch reference backend), and the eager runner. The stamps must
follow the path a step takes, tile the step without gaps or overlaps, and leave nothing wrapped behind."""

from __future__ import annotations

import random

import attrs
import pytest

from xrt.config import (
    CacheArgs,
    Device,
    DType,
    ExecutorArgs,
    ExecutorKind,
    LoadFormat,
    ModelArgs,
    XrtConfig,
)
from xrt.engine.engine import LLMEngine
from xrt.executor.graphs import prefill as prefill_module
from xrt.executor.graphs.capture import RerunCapture
from xrt.executor.runner import ModelRunner
from xrt.profile.prefill_parts import EAGER, HOST_PARTS, report, time_prefill_steps


def _config(kind: ExecutorKind) -> XrtConfig:
    model = ModelArgs(
        name="sim", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256, max_model_len=256,
        load_format=LoadFormat.DUMMY, dtype=DType.FLOAT32,
    )
    ex = ExecutorArgs(kind=kind, max_batch=4, prefill_graph=kind is ExecutorKind.CUDAGRAPH,
                      prefill_graph_max_tokens=64, prefill_graph_token_buckets=[32, 64], prefill_graph_max_seqs=2)
    return XrtConfig(model=model, device=Device.CPU, executor=ex, cache=CacheArgs(page_size=4, num_pages=256), seed=5)


def _engine(kind: ExecutorKind) -> LLMEngine:
    cfg = _config(kind)
    if kind is ExecutorKind.EAGER:
        return LLMEngine(cfg)
    # The engine checks executor.kind against the machine (cudagraph needs CUDA): it gets the graph runner and a
    # config that says eager.
    runner = ModelRunner(cfg, capture=RerunCapture())
    return LLMEngine(attrs.evolve(cfg, executor=attrs.evolve(cfg.executor, kind=ExecutorKind.EAGER)), runner=runner)


def _rows(lines: list[str]) -> dict[str, int]:
    """host part -> steps, from the report's first table."""
    out = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[2].isdigit():
            out[cells[0]] = int(cells[2])
    return out


def test_a_graph_prefill_passes_every_stamp_in_order_and_nothing_stays_wrapped() -> None:
    engine = _engine(ExecutorKind.CUDAGRAPH)
    graphs = engine.runner.prefill_graphs
    assert graphs is not None
    real_graphs, real_stage = graphs.graphs, prefill_module.stage_prefill
    replays = graphs.replays
    stamps = time_prefill_steps(engine, 1, 20, 3, random.Random(0))
    assert graphs.replays - replays == 3  # one replay per stamped prefill (the draining decode steps use none)
    order = ["start", *(name for name, _ in HOST_PARTS)]
    for s in stamps:
        assert list(s.host) == order  # every part once, in the order the code passes them
        times = [s.host[name] for name in order]
        assert times == sorted(times)
    rows = _rows(report(stamps))
    assert rows == {what: 3 for _, what in HOST_PARTS}
    # Put back: the class's methods, the module's function, the real graphs.
    assert "execute" not in vars(engine.runner) and "schedule" not in vars(engine.scheduler)
    assert "_sample" not in vars(engine) and "upload" not in vars(graphs.flat)
    assert "prepare_prefill_graph" not in vars(graphs.parts.backend)
    assert prefill_module.stage_prefill is real_stage and graphs.graphs is real_graphs
    engine.close()


def test_an_eager_prefill_is_one_runner_part_and_the_drain_stamps_nothing() -> None:
    engine = _engine(ExecutorKind.EAGER)
    stamps = time_prefill_steps(engine, 2, 12, 2, random.Random(1))
    for s in stamps:
        # The draining decode steps call schedule, execute and _sample again: their stamps must not land here.
        assert list(s.host) == ["start", "scheduled", "executed", "sampled", "end"]
    rows = _rows(report(stamps))
    assert rows[EAGER] == 2 and set(rows) == {HOST_PARTS[0][1], EAGER, HOST_PARTS[-2][1], HOST_PARTS[-1][1]}
    engine.close()


@pytest.mark.parametrize("kind", [ExecutorKind.EAGER, ExecutorKind.CUDAGRAPH])
def test_the_engine_still_generates_after_profiling(kind: ExecutorKind) -> None:
    """The wrappers gone, the engine's steps are its own again and the pages it used are free."""
    engine = _engine(kind)
    free = engine._kv.num_free_pages
    time_prefill_steps(engine, 1, 10, 2, random.Random(2))
    assert engine._kv.num_free_pages == free
    engine.add_request(list(range(1, 9)), {"max_tokens": 3, "temperature": 0.0, "ignore_eos": True})
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [len(o.token_ids) for o in outs] == [3]
    engine.close()
