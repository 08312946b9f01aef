"""executor=cudagraph against executor=eager on the GPU: decode logits bit-identical step by step,
greedy generations identical for the seed's batch sizes (odd ones pad up to a bucket) with
sequences finishing at different steps, one reaching max_model_len, and batches above the largest
bucket running eager. The engine decodes overlapped on the graph runner (launch_decode: a step
takes its input tokens from the previous step's in-graph argmax); sampled requests step
synchronously. A tiny Qwen3 shape with head_dim 128 (FlashInfer's) and dummy bf16 weights.

Cost: one eager and one graph LLM for the whole file (the graph one captures 13 buckets, ~1 s at this size)
with an explicit KV cache size (no sizing prefill); per test a few seconds at most once the FlashInfer bf16
decode and prefill modules are compiled. The smoke subset keeps batches 1, 7 (padded to 8) and 100 (padded to
112) and the overlapped-launch tests; the other seed batches and the mixed/above-bucket cases are `slow`."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from xrt.config import CacheArgs, DType, ExecutorArgs, ExecutorKind, LoadFormat, ModelArgs, SamplingArgs, XrtConfig
from xrt.executor.step import DecodeBatch, SeqChunk, StepInput

pytest.importorskip("flashinfer")

SEED_BATCHES = [1, 2, 3, 5, 7, 8, 13, 16, 31, 47, 100]
QUICK_BATCHES = {1, 7, 100}
BATCHES = [b if b in QUICK_BATCHES else pytest.param(b, marks=pytest.mark.slow) for b in SEED_BATCHES]
MAX_MODEL_LEN = 192
PAGE_SIZE = 16
NUM_PAGES = 2048


def graph_config(kind: ExecutorKind, **executor: object) -> XrtConfig:
    model = ModelArgs(
        name="graph-tiny", vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, rope_theta=10000.0,
        max_position_embeddings=1024, max_model_len=MAX_MODEL_LEN, load_format=LoadFormat.DUMMY,
        dtype=DType.BFLOAT16,
    )
    return XrtConfig(
        model=model,
        executor=ExecutorArgs(kind=kind, **executor),  # type: ignore[arg-type]
        cache=CacheArgs(page_size=PAGE_SIZE, num_pages=NUM_PAGES, prefix_caching=False),
        seed=7,
    )


@pytest.fixture(scope="module")
def llms() -> tuple[object, object]:
    """(eager, cudagraph) LLMs shared by every test here: engines are the expensive part of this file."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from xrt.engine.llm import LLM

    return LLM(graph_config(ExecutorKind.EAGER)), LLM(graph_config(ExecutorKind.CUDAGRAPH))


def workload(batch: int, seed: int) -> tuple[list[list[int]], list[SamplingArgs]]:
    """Prompts of different lengths wanting different numbers of tokens, so sequences finish at
    different steps and the decode batch shrinks through several buckets."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 4096) for _ in range(rng.randint(1, 60))] for _ in range(batch)]
    sampling = [SamplingArgs(max_tokens=rng.randint(1, 40), ignore_eos=True) for _ in range(batch)]
    return prompts, sampling


def generations(llm: object, prompts: list[list[int]], sampling: list[SamplingArgs]) -> list[tuple[list[int], str]]:
    return [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, sampling, use_tqdm=False)]  # type: ignore[attr-defined]


def test_graphs_captured_for_every_bucket(llms: tuple[object, object]) -> None:
    graphs = llms[1].engine.runner.decode_graphs  # type: ignore[attr-defined]
    assert sorted(graphs.graphs) == list(graphs.buckets.sizes)
    assert graphs.buckets.largest == llms[1].engine.cfg.executor.max_batch == 256  # type: ignore[attr-defined]


@pytest.mark.parametrize("batch", BATCHES)
def test_greedy_generation_identical_to_eager(llms: tuple[object, object], batch: int) -> None:
    eager, graph = llms
    prompts, sampling = workload(batch, seed=batch)
    want = generations(eager, prompts, sampling)
    got = generations(graph, prompts, sampling)
    assert [len(t) for t, _ in got] == [s.max_tokens for s in sampling]
    assert got == want


def test_sequence_reaching_max_model_len(llms: tuple[object, object]) -> None:
    eager, graph = llms
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 4096) for _ in range(n)] for n in (MAX_MODEL_LEN - 40, 5, 17)]
    sampling = [SamplingArgs(max_tokens=100, ignore_eos=True)] + [SamplingArgs(max_tokens=30, ignore_eos=True)] * 2
    want = generations(eager, prompts, sampling)
    got = generations(graph, prompts, sampling)
    assert got == want
    assert got[0][1] == "context_length" and len(prompts[0]) + len(got[0][0]) == MAX_MODEL_LEN


def random_decode_step(batch: int, rng: random.Random) -> StepInput:
    """One decode token per sequence at random positions (page tables disjoint and shuffled)."""
    pages = list(range(NUM_PAGES))
    rng.shuffle(pages)
    seqs = []
    for _ in range(batch):
        pos = rng.randrange(0, MAX_MODEL_LEN)
        n_pages = pos // PAGE_SIZE + 1
        table, pages = pages[:n_pages], pages[n_pages:]
        seqs.append(SeqChunk(token_ids=[rng.randrange(4096)], start_pos=pos, page_table=table))
    return StepInput(is_prefill=False, seqs=seqs)


@pytest.mark.parametrize("batch", BATCHES)
def test_replayed_decode_logits_bit_identical_to_eager(llms: tuple[object, object], batch: int) -> None:
    """Same runner, same KV cache: the graph replay and the eager path give the same float32 bits."""
    runner = llms[1].engine.runner  # type: ignore[attr-defined]
    step = random_decode_step(batch, random.Random(100 + batch))
    eager = runner.execute_eager(step).clone()
    graph = runner.execute(step)
    assert graph.shape == eager.shape == (batch, 4096)
    diff = (graph - eager).abs().max().item()
    assert torch.equal(graph, eager), f"batch {batch}: max |graph - eager| = {diff:.3e}"
    assert runner.last_argmax is not None
    assert torch.equal(runner.last_argmax, eager.argmax(dim=-1))


def test_decode_rows_without_logits_are_dropped(llms: tuple[object, object]) -> None:
    runner = llms[1].engine.runner  # type: ignore[attr-defined]
    step = random_decode_step(5, random.Random(9))
    seqs = [SeqChunk(c.token_ids, c.start_pos, c.page_table, needs_logits=i % 2 == 0) for i, c in enumerate(step.seqs)]
    step = StepInput(False, seqs)
    eager = runner.execute_eager(step).clone()
    graph = runner.execute(step)
    assert graph.shape == (3, 4096)
    assert torch.equal(graph, eager)
    assert torch.equal(runner.last_argmax, eager.argmax(dim=-1))


@pytest.mark.slow
def test_batches_above_the_largest_bucket_run_eager(llms: tuple[object, object]) -> None:
    """More sequences than the largest bucket: those steps run eager (and synchronously), the engine switches
    to graph launches once enough sequences have finished, and the tokens match eager throughout."""
    eager, graph = llms
    runner = graph.engine.runner  # type: ignore[attr-defined]
    largest = runner.decode_graphs.buckets.largest
    batch = largest + 2
    assert runner.decode_capacity == largest < batch
    prompts, sampling = workload(batch, seed=13)
    assert generations(graph, prompts, sampling) == generations(eager, prompts, sampling)
    runner.execute(random_decode_step(largest + 1, random.Random(1)))
    assert runner.last_argmax is None  # ran eager: no in-graph argmax


def test_engine_overlaps_decode_launches(llms: tuple[object, object], monkeypatch: pytest.MonkeyPatch) -> None:
    eager, graph = llms
    runner = graph.engine.runner  # type: ignore[attr-defined]
    chained: list[bool] = []
    launch = runner.launch_decode

    def counting(batch: DecodeBatch, after: object) -> object:
        chained.append(after is not None)
        return launch(batch, after)

    monkeypatch.setattr(runner, "launch_decode", counting)
    prompts, sampling = workload(8, seed=21)
    assert generations(graph, prompts, sampling) == generations(eager, prompts, sampling)
    assert sum(chained) > len(chained) // 2  # most launches took their tokens from the one before


@pytest.mark.slow
def test_sampled_and_greedy_requests_mixed_identical_to_eager(llms: tuple[object, object]) -> None:
    eager, graph = llms
    prompts, sampling = workload(7, seed=4)
    sampling = [
        SamplingArgs(temperature=0.8, top_k=50, seed=i, max_tokens=s.max_tokens, ignore_eos=True) if i % 2 else s
        for i, s in enumerate(sampling)
    ]
    assert generations(graph, prompts, sampling) == generations(eager, prompts, sampling)


def test_launched_step_takes_its_tokens_from_the_previous_launch(llms: tuple[object, object]) -> None:
    """Two graph launches, the second reading its input tokens (in permuted rows) from the first's
    in-graph argmax, against two eager steps fed through the host."""
    runner = llms[1].engine.runner  # type: ignore[attr-defined]
    rng = random.Random(5)
    batch = 5
    pages = list(range(NUM_PAGES))
    rng.shuffle(pages)
    tables = np.zeros((batch, runner.max_pages_per_seq), dtype=np.int32)
    positions = [rng.randrange(0, MAX_MODEL_LEN - 2) for _ in range(batch)]
    tokens = [rng.randrange(4096) for _ in range(batch)]
    for i, pos in enumerate(positions):
        k = (pos + 1) // PAGE_SIZE + 1  # covers the second step too
        tables[i, :k], pages = pages[:k], pages[k:]

    def eager_step(ids: list[int], shift: int) -> list[int]:
        rows = zip(ids, positions, tables.tolist(), strict=True)
        seqs = [SeqChunk([t], p + shift, table) for t, p, table in rows]
        return runner.execute_eager(StepInput(False, seqs)).argmax(dim=-1).tolist()

    want1 = eager_step(tokens, 0)
    want2 = eager_step(want1, 1)
    first = runner.launch_decode(DecodeBatch(tokens, [-1] * batch, positions, list(range(batch)), tables), None)
    perm = [3, 0, 4, 1, 2]
    second = runner.launch_decode(DecodeBatch([0] * batch, perm, [positions[j] + 1 for j in perm], perm, tables), first)
    assert first.tokens() == want1
    assert second.tokens() == [want2[j] for j in perm]
    with pytest.raises(RuntimeError, match="not the previous forward pass"):
        runner.launch_decode(DecodeBatch([0], [0], [0], [0], tables), first)


@pytest.mark.parametrize("batch", [1, 2])
def test_fused_qk_norm_rope_decode_matches_the_unfused(llms: tuple[object, object], batch: int) -> None:
    """executor.fuse_qk_norm_rope (on by default): decode batches on the Triton decode attention normalise, rotate
    and write this step's K/V inside that kernel. After the same prefill, a decode step's logits are those of a graph
    runner with it off within bf16 rounding (q and k are normalised with another reduction order), replayed or eager
    (those two bit for bit), and the token each sequence wrote is in the cache, as the next step reads it."""
    from xrt.engine.llm import LLM

    fused = llms[1].engine.runner  # type: ignore[attr-defined]
    unfused = LLM(graph_config(ExecutorKind.CUDAGRAPH, fuse_qk_norm_rope=False)).engine.runner  # type: ignore[attr-defined]
    rng = random.Random(batch)
    lens = [rng.randrange(20, MAX_MODEL_LEN - 8) for _ in range(batch)]
    tables = [list(range(i * 16, i * 16 + 16)) for i in range(batch)]
    prefill = StepInput(True, [SeqChunk([rng.randrange(4096) for _ in range(n)], 0, t)
                               for n, t in zip(lens, tables, strict=True)])
    for runner in (unfused, fused):
        runner.execute(prefill)
    for step_i in range(2):
        step = StepInput(False, [SeqChunk([rng.randrange(4096)], n + step_i, t)
                                 for n, t in zip(lens, tables, strict=True)])
        want = unfused.execute(step).clone()
        got = fused.execute(step).clone()
        assert fused.backend.fuses_qk_norm_rope(), "the fused runner's decode did not take the fused attention"
        assert not unfused.backend.fuses_qk_norm_rope()
        err = ((got - want).abs().max() / want.abs().max()).item()
        assert err < 2e-2, f"batch {batch} step {step_i}: relative logit difference {err:.3e}"
        if step_i == 0:
            assert torch.equal(fused.execute_eager(step), got), "fused eager and replayed decode differ"


@pytest.mark.parametrize("norms", [False, True], ids=["epilogues", "epilogues-and-norms"])
def test_prefill_epilogues_match_the_unfused(llms: tuple[object, object], norms: bool) -> None:
    """executor.fuse_qkv_epilogue and executor.fuse_prefill_activation: the prefill's qkv GEMM with the q/k norm,
    RoPE and KV write in its epilogue, its gate_up GEMM with the activation in its epilogue (this shape's bf16 heads
    of 128 and hidden size take both kernels); with executor.fuse_prefill_norms also the RMSNorms as those GEMMs'
    prologue and the residual adds in o_proj's and down's epilogue. After a ragged prefill of three prompts the
    logits and the K/V the prefill wrote are the unfused runner's within bf16 rounding (the GEMMs sum in another
    order than cuBLAS), each op ran once a layer (twice for linear_add), and the decode step reading that cache
    agrees too. With the switches on, greedy generation is the same on the eager and graph executors (both prefill
    through the kernels)."""
    from op_log import XrtOpLog

    from xrt.engine.llm import LLM

    on = {"fuse_qkv_epilogue": True, "fuse_prefill_activation": True, "fuse_prefill_norms": norms}
    fused_graph = LLM(graph_config(ExecutorKind.CUDAGRAPH, **on))
    fused, unfused = fused_graph.engine.runner, llms[1].engine.runner  # type: ignore[attr-defined]
    rng = random.Random(11)
    lens = [37, 100, 9]
    tables = [list(range(1000 + i * 16, 1000 + i * 16 + 16)) for i in range(len(lens))]
    prefill = StepInput(True, [SeqChunk([rng.randrange(4096) for _ in range(n)], 0, t)
                               for n, t in zip(lens, tables, strict=True)])
    want = unfused.execute(prefill).clone()
    log = XrtOpLog()
    with log:
        got = fused.execute(prefill).clone()
    layers = fused.cfg.model.num_hidden_layers
    assert log.calls.count("linear_qk_norm_rope_store_kv") == log.calls.count("linear_silu_and_mul") == layers
    assert "qk_norm_rope_store_kv" not in log.calls and "silu_and_mul" not in log.calls
    assert log.calls.count("linear_add") == (2 * layers if norms else 0)
    assert log.calls.count("fused_add_rms_norm") == (0 if norms else 2 * layers)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 2e-2, f"prefill: relative logit difference {err:.3e}"
    for n, table in zip(lens, tables, strict=True):
        slots = torch.arange(n)
        pages, offsets = torch.tensor(table)[slots // PAGE_SIZE], slots % PAGE_SIZE
        a = fused.kv_cache.tensor[:, pages, :, offsets].float()
        b = unfused.kv_cache.tensor[:, pages, :, offsets].float()
        assert ((a - b).abs().max() / b.abs().max()).item() < 2e-2, f"the K/V of a {n}-token prompt"
    step = StepInput(False, [SeqChunk([rng.randrange(4096)], n, t) for n, t in zip(lens, tables, strict=True)])
    want, got = unfused.execute(step), fused.execute(step)
    assert ((got - want).abs().max() / want.abs().max()).item() < 2e-2, "the decode step after the prefill"

    fused_eager = LLM(graph_config(ExecutorKind.EAGER, **on))
    prompts, sampling = workload(7, 5)  # one prefill step of more rows than skinny_gemm_max_rows
    assert generations(fused_eager, prompts, sampling) == generations(fused_graph, prompts, sampling)
