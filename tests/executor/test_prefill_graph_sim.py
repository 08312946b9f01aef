"""CUDA-graph prefill (executor.prefill_graph) on CPU: the host staging of a padded prefill, the
choice of graph shape, and the whole CudaGraphRunner simulated. The simulation fakes torch.cuda's
graphs (a replay re-runs the captured closure, which reads only the static buffers), events and
streams, and FlashInfer over a torch reference (paged attention for eager steps, ragged causal
attention over this step's k/v read from the static qo_indptr buffer for graph prefills). Greedy
generations with prefill graphs must equal the eager runner's, and steps that do not fit a graph
(a cached prefix, a later chunk, too many sequences or tokens) must run eager."""

from __future__ import annotations

import random
import types
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import pytest
import torch

from xrt.attention.flashinfer import FlashInferBackend, check_prefill_kernel
from xrt.config import (
    CacheArgs,
    Device,
    DType,
    ExecutorArgs,
    ExecutorKind,
    LoadFormat,
    ModelArgs,
    SamplingArgs,
    SchedulerArgs,
    XrtConfig,
)
from xrt.executor.graphs.capture import RerunCapture, RerunGraph
from xrt.executor.graphs.prefill import GraphChain, prefill_reserve, static_bytes
from xrt.executor.graphs.prefill_inputs import (
    PrefillShapes,
    default_token_buckets,
    padding_step,
    seq_buckets,
    stage_padding,
    stage_prefill,
)
from xrt.executor.runner import ModelRunner
from xrt.executor.step import SeqChunk, StepInput
from xrt.kvcache.sizing import leave_reserve
from xrt.units import GB

# -- staging and shapes (no fakes) -------------------------------------------------------------------


def test_default_buckets() -> None:
    assert default_token_buckets(8192) == [256, 512, 1024, 2048, 4096, 8192]
    assert default_token_buckets(3000) == [256, 512, 1024, 2048, 3000]
    assert default_token_buckets(100) == [100]
    assert seq_buckets(8) == [1, 2, 4, 8]
    assert seq_buckets(6) == [1, 2, 4, 6]
    assert seq_buckets(1) == [1]


def test_prefill_graph_is_off_by_default_and_buckets_are_checked() -> None:
    args = ExecutorArgs()
    assert args.prefill_graph is False and args.prefill_graph_max_tokens == 8192
    assert PrefillShapes.from_args(args) == PrefillShapes((1, 2, 4, 8), (256, 512, 1024, 2048, 4096, 8192))
    bad = ExecutorArgs(prefill_graph_max_tokens=64, prefill_graph_token_buckets=[16, 128])
    assert bad.check() == [("prefill_graph_token_buckets", "must all be <= prefill_graph_max_tokens=64, got 128")]
    assert PrefillShapes.from_args(ExecutorArgs(prefill_graph_token_buckets=[64, 16, 64])).token_sizes == (16, 64)


def prefill(*lengths: int, start_pos: int = 0) -> StepInput:
    return StepInput(True, [SeqChunk([7] * n, start_pos, list(range(64))) for n in lengths])


def test_fit_picks_the_smallest_shape_or_none() -> None:
    shapes = PrefillShapes((1, 2, 4, 8), (16, 32, 64))
    assert shapes.fit(prefill(16)) == (1, 16)
    assert shapes.fit(prefill(17)) == (1, 32)
    assert shapes.fit(prefill(3, 4, 5)) == (4, 16)
    assert shapes.fit(prefill(*[8] * 8)) == (8, 64)
    assert shapes.fit(prefill(*[1] * 9)) is None  # too many sequences
    assert shapes.fit(prefill(40, 30)) is None  # too many tokens
    assert shapes.fit(prefill(4, start_pos=8)) is None  # cached prefix / later chunk
    assert shapes.fit(StepInput(True, [SeqChunk([7], 0, [0]), SeqChunk([7], 3, [0])])) is None
    assert shapes.fit(StepInput(True, [SeqChunk([], 0, [])])) is None
    assert shapes.fit(StepInput(False, [SeqChunk([7], 0, [0])])) is None  # decode
    assert shapes.all()[0] == (8, 64) and shapes.all()[-1] == (1, 16) and len(shapes.all()) == 12


def test_stage_prefill_real_sequences_then_empty_slots_then_the_dummy() -> None:
    ps = 4
    step = StepInput(
        True,
        [
            SeqChunk([11, 12, 13, 14, 15], 0, [9, 2]),  # crosses into its 2nd page
            SeqChunk([21, 22], 0, [5], needs_logits=False),  # a first chunk: no logits
            SeqChunk([31], 0, [3]),
        ],
    )
    flat = np.full(3 * 12 + 4, 77, dtype=np.int64)  # junk: every slot the graph reads must be written
    qo = np.full(6, 77, dtype=np.int32)
    assert stage_prefill(step, 4, 12, ps, flat, qo) == 2
    ids, pos, slots, rows = flat[:12], flat[12:24], flat[24:36], flat[36:]
    assert ids.tolist() == [11, 12, 13, 14, 15, 21, 22, 31, 0, 0, 0, 0]
    assert pos.tolist() == [0, 1, 2, 3, 4, 0, 1, 0, 0, 0, 0, 0]
    assert slots.tolist() == [36, 37, 38, 39, 8, 20, 21, 12, -1, -1, -1, -1]
    assert rows.tolist() == [4, 7, 0, 0]
    assert qo.tolist() == [0, 5, 7, 8, 8, 12]


def test_stage_prefill_exact_fit_leaves_the_dummy_empty() -> None:
    flat = np.zeros(3 * 8 + 2, dtype=np.int64)
    qo = np.zeros(4, dtype=np.int32)
    assert stage_prefill(prefill(5, 3), 2, 8, 4, flat, qo) == 2
    assert qo.tolist() == [0, 5, 8, 8]
    assert flat[16:24].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]  # both page tables are 0..63
    assert flat[24:].tolist() == [4, 7]


def test_stage_prefill_rejects_what_no_graph_holds() -> None:
    flat = np.zeros(3 * 8 + 2, dtype=np.int64)
    qo = np.zeros(4, dtype=np.int32)
    with pytest.raises(ValueError, match=r"step.seqs\[0\]: a graph prefill starts at position 0, got 4"):
        stage_prefill(prefill(2, start_pos=4), 2, 8, 4, flat, qo)
    with pytest.raises(ValueError, match=r"step.seqs\[0\]: page_table has 1 pages, 5 tokens need 2"):
        stage_prefill(StepInput(True, [SeqChunk([1] * 5, 0, [3])]), 2, 8, 4, flat, qo)
    with pytest.raises(ValueError, match="3 sequences do not fit a prefill graph of 2"):
        stage_prefill(prefill(1, 1, 1), 2, 8, 4, flat, qo)
    with pytest.raises(ValueError, match="9 tokens do not fit a prefill graph of 8"):
        stage_prefill(prefill(5, 4), 2, 8, 4, flat, qo)


def test_stage_padding_and_padding_step_agree() -> None:
    for seqs, tokens in [(4, 16), (4, 4), (8, 3)]:
        flat = np.full(3 * tokens + seqs, 77, dtype=np.int64)
        qo = np.full(seqs + 2, 77, dtype=np.int32)
        stage_padding(seqs, tokens, flat, qo)
        assert flat[2 * tokens : 3 * tokens].tolist() == [-1] * tokens
        assert flat[:tokens].tolist() == [0] * tokens
        assert qo[-1] == tokens and all(np.diff(qo) >= 0)
        assert (flat[3 * tokens :] < tokens).all()
        step = padding_step(seqs, tokens, 4)
        lengths = [len(c.token_ids) for c in step.seqs]
        assert sum(lengths) == tokens
        assert lengths[: min(seqs, tokens)] == [1] * min(seqs, tokens)


def test_static_bytes_counts_every_buffer() -> None:
    shapes = PrefillShapes((1, 2), (16, 32))
    fi = object.__new__(FlashInferBackend)
    backend = fi.prefill_graph_bytes(shapes.max_seqs + 1)
    assert backend == 2 * 4 * 4 + (2 << 20)  # qo and kv indptr of 3 entries, the integer workspace
    assert static_bytes(shapes, 100, 2, backend) == 8 * (96 + 2) + 2 * 100 * 2 + 8 * 2 + 2 * 4 * 4 + (2 << 20)


# -- FlashInferBackend's CUDA-graph prefill wrappers, over a recording stand-in for flashinfer -------


class RecordingWrapper:
    """Stands in for flashinfer.BatchPrefillWithRaggedKVCacheWrapper."""

    fail: str | None = None

    def __init__(self, workspace: torch.Tensor, layout: str, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.int_workspace: torch.Tensor | None = None
        self.plans: list[list[int]] = []

    def reset_workspace_buffer(self, float_workspace: torch.Tensor, int_workspace: torch.Tensor) -> None:
        self.int_workspace = int_workspace

    def plan(self, qo: torch.Tensor, kv: torch.Tensor, *args: Any, causal: bool, **kwargs: Any) -> None:
        if self.fail:
            raise RuntimeError(self.fail)
        assert causal and torch.equal(qo, kv)
        self.plans.append(qo.tolist())


def recording_backend() -> FlashInferBackend:
    backend = object.__new__(FlashInferBackend)  # no flashinfer on this machine
    backend._fi = types.SimpleNamespace(BatchPrefillWithRaggedKVCacheWrapper=RecordingWrapper)
    backend.device = torch.device("cpu")
    backend.workspace = torch.empty(32 << 20, dtype=torch.uint8)
    backend._heads = (4, 2, 128)
    backend.dtype = backend.kv_dtype = torch.bfloat16
    backend.scale = 128**-0.5
    backend.prefill_kernel = "fa2"
    backend.plans = 0
    backend._set_active(None, "")
    return backend


def test_graph_prefill_wrappers_share_buffers_and_replan_only_when_needed() -> None:
    backend = recording_backend()
    qo_static = backend.init_prefill_graphs([(3, 16), (3, 32), (5, 16)])
    bufs = backend._graph_prefill_buffers
    assert bufs is not None and bufs.qo_indptr is qo_static and qo_static.numel() == 6
    wrappers = backend._graph_prefill
    for (entries, _), w in wrappers.items():
        assert w.kwargs["use_cuda_graph"] is True
        assert w.kwargs["backend"] == "fa2"  # executor.prefill_attention, as the backend was built with
        assert w.kwargs["qo_indptr_buf"].numel() == w.kwargs["kv_indptr_buf"].numel() == entries + 1
        assert w.kwargs["qo_indptr_buf"].data_ptr() == bufs.qo_indptr.data_ptr()
        assert w.int_workspace is bufs.int_workspace  # one integer workspace for all of them
    qo = torch.tensor([0, 5, 9, 16], dtype=torch.int32)
    backend.prepare_prefill_graph(qo)
    backend.prepare_prefill_graph(qo.clone())  # same plan: kept
    assert wrappers[(3, 16)].plans == [[0, 5, 9, 16]] and backend._active_kind == "ragged"
    backend.prepare_prefill_graph(torch.tensor([0, 5, 9, 9, 9, 16], dtype=torch.int32))
    backend.prepare_prefill_graph(qo)  # another wrapper planned in between: the shared workspace changed
    assert wrappers[(3, 16)].plans == [[0, 5, 9, 16]] * 2 and backend._active is wrappers[(3, 16)]
    backend.prepare_prefill_graph(torch.tensor([0, 1, 2, 16], dtype=torch.int32))
    assert len(wrappers[(3, 16)].plans) == 3 and backend.plans == 4
    with pytest.raises(ValueError, match=r"no CUDA-graph prefill wrapper for 3 sequences and 64 tokens"):
        backend.prepare_prefill_graph(torch.tensor([0, 1, 2, 64], dtype=torch.int32))
    RecordingWrapper.fail = "Buffer overflow when allocating memory for batch_prefill_tmp_v"
    try:
        with pytest.raises(ValueError, match=r"^executor.workspace_mb: 32 MiB is too small for a CUDA-graph prefill "
                                             r"of 32 tokens"):
            backend.prepare_prefill_graph(torch.tensor([0, 1, 2, 32], dtype=torch.int32))
        RecordingWrapper.fail = "something else"
        with pytest.raises(RuntimeError, match="something else"):
            backend.prepare_prefill_graph(torch.tensor([0, 1, 3, 32], dtype=torch.int32))
    finally:
        RecordingWrapper.fail = None


# -- the graph runner on CPU: the real graph managers over the torch reference, "graphs" that re-run ----


def graph_runner(cfg: XrtConfig) -> ModelRunner:
    """The CUDA-graph runner's parts on CPU: decode and prefill graph managers over the torch reference
    backend, whose replays re-run the captured function (reading only the static buffers)."""
    return ModelRunner(cfg, capture=RerunCapture())


def engine_config(cfg: XrtConfig) -> XrtConfig:
    """The engine checks executor.kind against the machine (cudagraph needs CUDA); it gets the runner built
    from `cfg` and a config that says eager."""
    return attrs.evolve(cfg, executor=attrs.evolve(cfg.executor, kind=ExecutorKind.EAGER))


VOCAB = 512
MAX_MODEL_LEN = 512
MAX_TOKENS = 128  # token buckets 32, 64, 128
MAX_SEQS = 8  # sequence buckets 1, 2, 4, 8


def sim_config(kind: ExecutorKind, num_pages: int = 4096, **executor: Any) -> XrtConfig:
    model = ModelArgs(
        name="sim", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=MAX_MODEL_LEN,
        max_model_len=MAX_MODEL_LEN, load_format=LoadFormat.DUMMY, dtype=DType.FLOAT32,
    )
    ex = ExecutorArgs(
        kind=kind, max_batch=16, prefill_graph=kind is ExecutorKind.CUDAGRAPH, prefill_graph_max_tokens=MAX_TOKENS,
        prefill_graph_token_buckets=[32, 64, 128], prefill_graph_max_seqs=MAX_SEQS, **executor,
    )
    return XrtConfig(
        model=model, device=Device.CPU, executor=ex,
        cache=CacheArgs(page_size=4, num_pages=num_pages, prefix_caching=True),
        # Prompts over 128 tokens are chunked: the first chunk (start 0, no logits) fits a graph exactly.
        scheduler=SchedulerArgs(max_batched_tokens=MAX_TOKENS),
        seed=3,
    )


def widen_weights(model: torch.nn.Module) -> None:
    """Dummy weights (std 0.02) make greedy output nearly context-free; std 0.3 makes it depend on
    every token, so a wrong attention row changes the generations."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(15.0)


class Spy:
    """Records, per prefill step the graph runner executes, whether a graph replayed it."""

    def __init__(self, graphs: Any) -> None:
        self.graphs = graphs
        self.run = graphs.run
        self.steps: list[tuple[StepInput, bool]] = []
        graphs.run = self

    def __call__(self, step: StepInput) -> Any:
        out = self.run(step)
        self.steps.append((step, out is not None))
        return out


# executor.prefill_graph_head_layers: one graph a shape; a head of 1 of the 2 layers and a tail; all layers in
# the head (the tail is the final norm and lm_head).
@pytest.fixture(scope="module", params=[0, 1, 2], ids=lambda n: f"head{n}")
def sim(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any, Spy]]:
    from xrt.engine.llm import LLM

    eager = LLM(sim_config(ExecutorKind.EAGER))
    cfg = sim_config(ExecutorKind.CUDAGRAPH, prefill_graph_head_layers=request.param)
    graph = LLM(engine_config(cfg), runner=graph_runner(cfg))
    for llm in (eager, graph):
        widen_weights(llm.engine.runner.model)
    yield eager, graph, Spy(graph.engine.runner.prefill_graphs)


def generations(llm: Any, prompts: list[list[int]], sampling: list[SamplingArgs]) -> list[tuple[list[int], str]]:
    return [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, sampling, use_tqdm=False)]


def test_graphs_captured_for_every_shape(sim: tuple[Any, Any, Spy]) -> None:
    runner = sim[1].engine.runner
    graphs = runner.prefill_graphs
    assert sorted(graphs.graphs) == sorted((s, t) for s in (1, 2, 4, 8) for t in (32, 64, 128))
    for graph in graphs.graphs.values():  # a head and a tail, or one graph
        assert isinstance(graph, GraphChain) == (graphs.head_layers > 0)
        assert len(graph.graphs) == 2 if isinstance(graph, GraphChain) else isinstance(graph, RerunGraph)
    assert not graphs._between  # no head's output held after the captures
    assert sorted(runner.decode_graphs.graphs) == [1, 2, 4, 8, 16]  # the decode graphs as before
    assert runner.decode_capacity == 16
    eager = sim[0].engine.runner
    assert eager.decode_graphs is None and eager.prefill_graphs is None and eager.decode_capacity == 0


@pytest.mark.parametrize("batch", [1, 2, 3, 8, 9])
def test_greedy_generation_identical_to_eager(sim: tuple[Any, Any, Spy], batch: int) -> None:
    eager, graph, spy = sim
    rng = random.Random(1000 + batch)
    # Lengths vary; 9 prompts of up to 14 tokens fit the token budget in one step but not a graph.
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 14))] for _ in range(batch)]
    sampling = [SamplingArgs(max_tokens=rng.randint(1, 12), ignore_eos=True) for _ in range(batch)]
    before = len(spy.steps)
    want = generations(eager, prompts, sampling)
    got = generations(graph, prompts, sampling)
    assert got == want
    assert [len(t) for t, _ in got] == [s.max_tokens for s in sampling]
    steps = spy.steps[before:]
    assert [len(step.seqs) for step, _ in steps] == [batch]  # one prefill step
    assert steps[0][1] is (batch <= MAX_SEQS)


def test_chunked_prompt_first_chunk_replays_later_chunk_runs_eager(sim: tuple[Any, Any, Spy]) -> None:
    eager, graph, spy = sim
    rng = random.Random(7)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(150)]]
    sampling = [SamplingArgs(max_tokens=8, ignore_eos=True)]
    before = len(spy.steps)
    assert generations(graph, prompts, sampling) == generations(eager, prompts, sampling)
    steps = spy.steps[before:]
    # 128 tokens without logits (an exact fit: the dummy sequence is empty), then 22 from position 128.
    assert [(len(s.seqs[0].token_ids), s.seqs[0].start_pos, replayed) for s, replayed in steps] == [
        (128, 0, True), (22, 128, False)
    ]


def test_cached_prefix_runs_eager(sim: tuple[Any, Any, Spy]) -> None:
    eager, graph, spy = sim
    rng = random.Random(8)
    shared = [rng.randrange(1, VOCAB) for _ in range(16)]
    sampling = [SamplingArgs(max_tokens=6, ignore_eos=True)]
    before = len(spy.steps)
    for tail in ([], [5, 6, 7]):
        assert generations(graph, [shared + tail], sampling) == generations(eager, [shared + tail], sampling)
    steps = spy.steps[before:]
    assert [(s.seqs[0].start_pos > 0, replayed) for s, replayed in steps] == [(False, True), (True, False)]


def random_prefill(lengths: list[int], rng: random.Random, no_logits: set[int]) -> StepInput:
    pages = list(range(1000, 4096))
    rng.shuffle(pages)
    seqs = []
    for i, n in enumerate(lengths):
        k = -(-n // 4)
        table, pages = pages[:k], pages[k:]
        seqs.append(SeqChunk([rng.randrange(VOCAB) for _ in range(n)], 0, table, needs_logits=i not in no_logits))
    return StepInput(True, seqs)


@pytest.mark.parametrize(
    ("lengths", "no_logits"), [([32], set()), ([5], set()), ([9, 1, 30], {1}), ([3] * 8, {0, 7}), ([20, 12], {0, 1})]
)
def test_replayed_logits_match_eager_on_the_same_runner(
    sim: tuple[Any, Any, Spy], lengths: list[int], no_logits: set[int]
) -> None:
    runner = sim[1].engine.runner
    step = random_prefill(lengths, random.Random(sum(lengths)), no_logits)
    want = runner.execute_eager(step).clone()
    graphs_before = len(sim[2].steps)
    got = runner.execute(step)
    assert sim[2].steps[graphs_before][1] is True
    assert got.shape == want.shape == (len(lengths) - len(no_logits), VOCAB)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert runner.last_argmax is not None
    assert torch.equal(runner.last_argmax, want.argmax(dim=-1))


def test_padding_writes_no_kv(sim: tuple[Any, Any, Spy]) -> None:
    """A replay writes exactly its sequences' slots: the padding tokens (slot -1) write nothing."""
    runner = sim[1].engine.runner
    step = random_prefill([5, 6], random.Random(3), set())
    kv = runner.kv_cache.tensor
    kv.zero_()
    runner.execute(step)
    written = kv[0].abs().sum(dim=(1, 3, 4)).flatten() != 0  # [pages * page_size] per slot
    want = torch.zeros_like(written)
    for chunk in step.seqs:
        for pos in range(len(chunk.token_ids)):
            want[chunk.page_table[pos // 4] * 4 + pos % 4] = True
    assert torch.equal(written, want)


def test_kv_cache_leaves_room_for_the_prefill_graphs() -> None:
    """Sized from cache.kv_size_gb, the cache leaves the prefill graphs their static buffers (on CPU there
    is no graph memory pool to measure); a reserve that leaves no page is a clear error."""
    cfg = sim_config(ExecutorKind.CUDAGRAPH, num_pages=0)
    cfg.cache.kv_size_gb = 0.01
    runner = graph_runner(cfg)
    shapes = PrefillShapes.from_args(cfg.executor)
    per_page = runner.kv_layout.bytes_per_page
    reserve = static_bytes(shapes, VOCAB, 4, runner.backend.prefill_graph_bytes(MAX_SEQS + 1))
    assert runner.num_pages == int(0.01 * GB) // per_page - -(-reserve // per_page)
    assert runner.kv_cache.tensor.shape[1] == runner.num_pages
    pool = 123_456
    got = prefill_reserve(shapes, pool, reserve)
    assert got.bytes == pool + reserve
    assert got.holder == "the prefill graphs (pool 0.00 GiB for 8 sequences x 128 tokens)"
    assert leave_reserve(1000, per_page, got) == 1000 - -(-(pool + reserve) // per_page)
    with pytest.raises(ValueError, match=r"^executor.prefill_graph_max_tokens: prefill graphs of 128 tokens"):
        leave_reserve(1000, per_page, prefill_reserve(shapes, 10**12, reserve))


@pytest.mark.parametrize("kernel", ["auto", "fa2", "fa3"])
def test_prefill_kernel_checked_against_the_device(kernel: str) -> None:
    """executor.prefill_attention=fa3 on a GPU older than Hopper is refused in one line naming the field; every
    kernel is accepted on Hopper, and auto and fa2 everywhere."""
    check_prefill_kernel(kernel, (9, 0))
    if kernel != "fa3":
        check_prefill_kernel(kernel, (8, 0))
        return
    with pytest.raises(ValueError, match=r"^executor.prefill_attention: fa3 needs a Hopper .* this one is sm_86; use "):
        check_prefill_kernel(kernel, (8, 6))
