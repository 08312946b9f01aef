"""The eager executor: step metadata, device/dtype resolution, runner construction (checkpoint,
dummy weights, KV sizing and binding) and execute()'s output contract."""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import pytest
import torch

from xrt.attention.metadata import AttentionMetadata
from xrt.attention.torch_ref import TorchRefBackend
from xrt.config import CacheArgs, Device, DType, ExecutorArgs, ExecutorKind, LoadFormat, XrtConfig
from xrt.executor.device import resolve_device, resolve_dtype
from xrt.executor.factory import build_runner
from xrt.executor.prepare import build_metadata
from xrt.executor.runner import ModelRunner
from xrt.executor.step import SeqChunk, StepInput
from xrt.kernels.qk_norm_rope_args import QKNormRope
from xrt.models.loader import CheckpointError
from xrt.models.tiny import tiny_model_args
from xrt.ops import reference


def test_build_metadata_ragged_batch() -> None:
    step = StepInput(
        True,
        [
            SeqChunk([11, 12, 13, 14, 15], 0, [7, 2]),
            SeqChunk([21, 22, 23], 6, [4, 9, 1], needs_logits=False),
            SeqChunk([31], 4, [3, 5, 8]),
        ],
    )
    ids, m = build_metadata(step, 4, "cpu")
    assert ids.tolist() == [11, 12, 13, 14, 15, 21, 22, 23, 31]
    assert m.positions.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 4]
    assert m.slot_mapping.tolist() == [28, 29, 30, 31, 8, 38, 39, 4, 20]
    assert m.qo_indptr.tolist() == [0, 5, 8, 9]
    assert m.kv_indptr.tolist() == [0, 2, 5, 7]
    assert m.kv_indices.tolist() == [7, 2, 4, 9, 1, 3, 5]
    assert m.kv_last_page_len.tolist() == [1, 1, 1]
    assert m.seq_lens.tolist() == [5, 9, 5]
    assert m.logits_indices.tolist() == [4, 8]
    assert m.has_prefix and m.is_prefill and m.num_seqs == 3 and m.num_tokens == 9 and m.page_size == 4
    h = m.host
    assert h is not None
    for dev, host in [(m.qo_indptr, h.qo_indptr), (m.kv_indptr, h.kv_indptr), (m.kv_indices, h.kv_indices),
                      (m.kv_last_page_len, h.kv_last_page_len), (m.seq_lens, h.seq_lens)]:
        assert host.device.type == "cpu" and host.dtype == dev.dtype == torch.int32
        assert torch.equal(host, dev.cpu())
    assert ids.dtype == m.positions.dtype == m.slot_mapping.dtype == m.logits_indices.dtype == torch.int64


def test_build_metadata_decode_without_prefix_flag() -> None:
    _, m = build_metadata(StepInput(True, [SeqChunk([1, 2, 3], 0, [0])]), 4, "cpu")
    assert not m.has_prefix and m.kv_last_page_len.tolist() == [3]
    _, m = build_metadata(StepInput(False, [SeqChunk([5], 3, [6]), SeqChunk([6], 8, [1, 2, 3])]), 4, "cpu")
    assert m.has_prefix and not m.is_prefill
    assert m.slot_mapping.tolist() == [27, 12] and m.kv_last_page_len.tolist() == [4, 1]


def test_build_metadata_rejects_bad_chunks() -> None:
    with pytest.raises(ValueError, match=r"step\.seqs\[1\]: page_table has 1 pages, 5 tokens need 2"):
        build_metadata(StepInput(True, [SeqChunk([1], 0, [0]), SeqChunk([1, 2], 3, [4])]), 4, "cpu")
    with pytest.raises(ValueError, match=r"step\.seqs\[0\]: a decode chunk carries exactly one token, got 2"):
        build_metadata(StepInput(False, [SeqChunk([1, 2], 0, [0])]), 4, "cpu")


def test_device_and_dtype_resolution() -> None:
    cpu = XrtConfig(device=Device.CPU)
    assert resolve_device(cpu).type == "cpu"
    assert resolve_dtype(cpu, torch.device("cpu")) == torch.float32
    assert resolve_dtype(cpu, torch.device("cuda")) == torch.bfloat16
    cpu.model.dtype = DType.FLOAT16
    assert resolve_dtype(cpu, torch.device("cpu")) == torch.float16
    auto = XrtConfig()
    assert resolve_device(auto).type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="device: cuda requested"):
        resolve_device(XrtConfig(device=Device.CUDA))
    cfg = XrtConfig(executor=ExecutorArgs(kind=ExecutorKind.CUDAGRAPH))
    with pytest.raises(ValueError, match="executor.kind: cudagraph needs a CUDA device"):
        build_runner(cfg)


def dummy_config(**cache: object) -> XrtConfig:
    model = attrs.evolve(tiny_model_args(), load_format=LoadFormat.DUMMY)
    return XrtConfig(model=model, device=Device.CPU, cache=CacheArgs(page_size=4, **cache), seed=3)


def test_runner_with_checkpoint(tiny_cfg: Callable[..., XrtConfig]) -> None:
    runner = build_runner(tiny_cfg(cache=CacheArgs(page_size=4, num_pages=32)))
    assert isinstance(runner, ModelRunner)
    assert runner.checkpoint_dir is not None
    assert (runner.device.type, runner.dtype, runner.num_pages, runner.page_size, runner.max_model_len) == (
        "cpu", torch.float32, 32, 4, 1024)
    kv = runner.kv_cache.tensor
    assert kv.shape == (3, 32, 2, 4, 2, 16) and runner.kv_cache.num_pages == 32
    for i, layer in enumerate(runner.attention_layers):
        assert layer.kv_cache.data_ptr() == kv[i].data_ptr()

    out = runner.execute(StepInput(True, [SeqChunk([5, 6, 7, 8, 9, 10], 0, [9, 3]), SeqChunk([1, 2], 0, [5])]))
    assert out.dtype == torch.float32 and out.shape == (2, 2048) and torch.isfinite(out).all()
    written = kv.abs().sum(dim=(0, 2, 4, 5)) != 0  # [page, offset]
    expected = torch.zeros(32, 4, dtype=torch.bool)
    expected[9, :] = expected[3, :2] = expected[5, :2] = True
    assert torch.equal(written, expected)

    none = runner.execute(StepInput(True, [SeqChunk([3], 0, [0], needs_logits=False)]))
    assert none.shape == (0, 2048) and none.dtype == torch.float32


def test_runner_config_must_match_checkpoint(tiny_checkpoint: str) -> None:
    model = attrs.evolve(tiny_model_args(), hidden_size=128, path=tiny_checkpoint)
    with pytest.raises(CheckpointError, match=r"^model\.hidden_size: 128 does not match 64 in .*config\.json$"):
        ModelRunner(XrtConfig(model=model, device=Device.CPU, cache=CacheArgs(num_pages=4)))


def test_dummy_runner_is_seeded_and_sizes_kv_from_gb() -> None:
    a, b = ModelRunner(dummy_config(kv_size_gb=0.001)), ModelRunner(dummy_config(kv_size_gb=0.001))
    assert a.checkpoint_dir is None
    bytes_per_page = 3 * 2 * 4 * 2 * 16 * 4  # layers, K/V, page, kv heads, head dim, fp32
    assert a.kv_layout.bytes_per_page == bytes_per_page and a.num_pages == math.floor(1e6 / bytes_per_page)
    step = StepInput(True, [SeqChunk([4, 5, 6], 0, [2])])
    assert torch.equal(a.execute(step), b.execute(step))


def test_kv_size_too_small_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cache.kv_size_gb"):
        ModelRunner(dummy_config(kv_size_gb=1e-9))


def test_bfloat16_runner_returns_float32_logits() -> None:
    cfg = dummy_config(num_pages=8)
    cfg.model.dtype = DType.BFLOAT16
    runner = ModelRunner(cfg)
    assert runner.dtype == torch.bfloat16 and runner.kv_cache.tensor.dtype == torch.bfloat16
    out = runner.execute(StepInput(True, [SeqChunk([4, 5, 6], 0, [2])]))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


class RaggedRefBackend(TorchRefBackend):
    """The torch reference, except that a prefill with no cached prefix attends over the k and v the layer
    hands over (causal within each sequence) and never reads the cache: what FlashInfer's ragged prefill
    does on CUDA."""

    def __init__(self) -> None:
        super().__init__()
        self.ragged_calls = 0

    def plan(self, meta: AttentionMetadata) -> None:
        super().plan(meta)
        self.meta = meta

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_idx: int, scale: float,
                k: torch.Tensor | None = None, v: torch.Tensor | None = None, pdl: bool | None = None) -> torch.Tensor:
        meta = self.meta
        assert k is not None and v is not None
        assert k.shape == v.shape == (q.shape[0], kv_cache.shape[3], kv_cache.shape[4])
        if not meta.is_prefill or meta.has_prefix:
            return super().forward(q, kv_cache, layer_idx, scale, k, v)
        self.ragged_calls += 1
        group = q.shape[1] // k.shape[1]
        out = torch.empty(q.shape, dtype=q.dtype)
        assert meta.host is not None
        bounds = meta.host.qo_indptr.tolist()
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            qi = q[start:end].float()
            ki = k[start:end].float().repeat_interleave(group, dim=1)
            vi = v[start:end].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", qi, ki) * scale
            n = end - start
            scores.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vi).to(q.dtype)
        return out


def test_layers_hand_the_backend_this_steps_k_and_v() -> None:
    """A backend that attends over the layer's k/v instead of the cache gives the reference's logits, for a
    ragged batch prefill; later steps (a prefix, a decode) read the cache the prefill wrote."""
    ref, ragged = ModelRunner(dummy_config(num_pages=16)), ModelRunner(dummy_config(num_pages=16))
    ragged.backend = RaggedRefBackend()
    steps = [
        StepInput(True, [SeqChunk([5, 6, 7, 8, 9, 10], 0, [9, 3]), SeqChunk([1, 2, 3], 0, [5])]),
        StepInput(True, [SeqChunk([11, 12], 6, [9, 3])]),
        StepInput(False, [SeqChunk([4], 3, [5])]),
    ]
    for step in steps:
        torch.testing.assert_close(ragged.execute(step), ref.execute(step), rtol=1e-5, atol=1e-5)
    assert ragged.backend.ragged_calls == 3  # the first step, once per layer
    assert torch.equal(ragged.kv_cache.tensor, ref.kv_cache.tensor)


class FusingRefBackend(TorchRefBackend):
    """Fuses the layers' q/k norm, RoPE and KV write into decode attention, as FlashInfer's small-batch decode does
    with executor.fuse_qk_norm_rope, with the reference ops inside: the layer must hand forward_fused what it would
    have handed xrt::qk_norm_rope_store_kv, and run neither that op nor forward itself."""

    def __init__(self) -> None:
        super().__init__()
        self.decode = False
        self.fused_calls = 0

    def plan(self, meta: AttentionMetadata) -> None:
        super().plan(meta)
        self.decode = not meta.is_prefill

    def fuses_qk_norm_rope(self) -> bool:
        return self.decode

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_idx: int, scale: float,
                k: torch.Tensor | None = None, v: torch.Tensor | None = None, pdl: bool | None = None) -> torch.Tensor:
        assert not self.decode, "a fused step's layer called forward"
        return super().forward(q, kv_cache, layer_idx, scale, k, v)

    def forward_fused(self, qkv: torch.Tensor, rope: QKNormRope, kv_cache: torch.Tensor, layer_idx: int,
                      scale: float, pdl: bool | None = None) -> torch.Tensor:
        self.fused_calls += 1
        kv, d = kv_cache.shape[3], kv_cache.shape[4]
        h = qkv.shape[1] // d - 2 * kv
        qkv = qkv.clone()  # the fused kernel leaves qkv as it is
        reference.qk_norm_rope_store_kv(qkv, rope.q_weight, rope.k_weight, rope.cos_sin_cache, rope.positions, kv_cache,
                                        rope.slot_mapping, h, kv, d, rope.eps)
        return super().forward(qkv[:, : h * d].view(-1, h, d), kv_cache, layer_idx, scale)


def test_layers_hand_a_fusing_backend_the_raw_qkv() -> None:
    """Where the backend fuses the q/k norm, RoPE and KV write (decode steps here), each layer hands it the raw qkv
    with its norm weights, the rotary cache, positions, slots and eps, once, and runs the ops itself elsewhere: the
    logits and the cache equal the reference runner's."""
    ref, fused = ModelRunner(dummy_config(num_pages=16)), ModelRunner(dummy_config(num_pages=16))
    fused.backend = FusingRefBackend()
    steps = [
        StepInput(True, [SeqChunk([5, 6, 7, 8, 9, 10], 0, [9, 3]), SeqChunk([1, 2, 3], 0, [5])]),
        StepInput(False, [SeqChunk([4], 6, [9, 3]), SeqChunk([8], 3, [5])]),
        StepInput(False, [SeqChunk([2], 7, [9, 3]), SeqChunk([6], 4, [5, 11])]),
    ]
    for step in steps:
        torch.testing.assert_close(fused.execute(step), ref.execute(step), rtol=0, atol=0)
    assert fused.backend.fused_calls == 2 * fused.cfg.model.num_hidden_layers
    assert torch.equal(fused.kv_cache.tensor, ref.kv_cache.tensor)


def prefill_fusion_steps() -> list[StepInput]:
    """For the prefill fusion switches at skinny_gemm_max_rows=4: two prefills of more rows (the second over a cached
    prefix) and two decode steps, of fewer rows and of more."""
    return [
        StepInput(True, [SeqChunk([5, 6, 7, 8, 9, 10], 0, [9, 3]), SeqChunk([1, 2, 3], 0, [5])]),  # 9 rows
        StepInput(True, [SeqChunk([11, 12, 13, 14, 15], 6, [9, 3, 7])]),  # 5 rows over a cached prefix
        StepInput(False, [SeqChunk([4], 11, [9, 3, 7]), SeqChunk([8], 3, [5])]),  # 2 rows
        # a decode step of more rows than skinny_gemm_max_rows: not a prefill, so the ops apart
        StepInput(False, [SeqChunk([20 + i], 0, [page]) for i, page in enumerate((0, 1, 2, 4, 6))]),
    ]


def test_prefill_epilogue_switches_run_one_op_a_layer_for_prefill_rows() -> None:
    """executor.fuse_qkv_epilogue and executor.fuse_prefill_activation: prefill passes of more rows than
    skinny_gemm_max_rows run each layer's qkv projection, q/k norm, RoPE and KV write as one
    xrt::linear_qk_norm_rope_store_kv and its gate_up projection and activation as one xrt::linear_silu_and_mul (on
    CPU their references: the same ops); smaller passes and decode steps of any size the ops apart. Logits and cache
    equal the unfused runner's bit for bit, through a prefill, a prefix continuation and decodes that read what they
    wrote."""
    from op_log import XrtOpLog

    ref = ModelRunner(dummy_config(num_pages=16))
    cfg = dummy_config(num_pages=16)
    cfg.executor.fuse_qkv_epilogue = True
    cfg.executor.fuse_prefill_activation = True
    cfg.executor.skinny_gemm_max_rows = 4
    fused = ModelRunner(cfg)
    steps = prefill_fusion_steps()
    layers = cfg.model.num_hidden_layers
    for step, fused_calls in zip(steps, (layers, layers, 0, 0), strict=True):
        want = ref.execute(step)
        log = XrtOpLog()
        with log:
            got = fused.execute(step)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert log.calls.count("linear_qk_norm_rope_store_kv") == fused_calls
        assert log.calls.count("qk_norm_rope_store_kv") == layers - fused_calls
        assert log.calls.count("linear_silu_and_mul") == fused_calls
        assert log.calls.count("silu_and_mul") == layers - fused_calls
    assert torch.equal(fused.kv_cache.tensor, ref.kv_cache.tensor)


def test_prefill_norms_switch_folds_the_norms_into_the_gemms_for_prefill_rows() -> None:
    """executor.fuse_prefill_norms (with both epilogue switches): prefill passes run no norm op but the final one;
    each layer's input and post-attention RMSNorms are passed to the qkv and gate_up ops (their prologue on CUDA)
    and its residual adds are xrt::linear_add after o_proj and down. On CPU the ops' references compute what the
    unfused layers do, so logits and cache equal the unfused runner's bit for bit, through a prefill, a prefix
    continuation and decodes (unfused layers, also at more rows than skinny_gemm_max_rows) that read what they
    wrote."""
    from op_log import XrtOpLog

    ref = ModelRunner(dummy_config(num_pages=16))
    cfg = dummy_config(num_pages=16)
    cfg.executor.fuse_qkv_epilogue = True
    cfg.executor.fuse_prefill_activation = True
    cfg.executor.fuse_prefill_norms = True
    cfg.executor.skinny_gemm_max_rows = 4
    fused = ModelRunner(cfg)
    # Dummy weights give every norm a weight of ones: distinct random weights (the same in both runners), so a norm
    # applied in the wrong place shows.
    gen = torch.Generator().manual_seed(7)
    for (name, a), b in zip(ref.model.named_parameters(), fused.model.parameters(), strict=True):
        if name.endswith("layernorm.weight") or name.endswith("model.norm.weight"):
            a.data.copy_(torch.rand(a.shape, generator=gen) + 0.5)
            b.data.copy_(a.data)
    steps = prefill_fusion_steps()
    layers = cfg.model.num_hidden_layers
    for step, folded in zip(steps, (True, True, False, False), strict=True):
        want = ref.execute(step)
        log = XrtOpLog()
        with log:
            got = fused.execute(step)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert log.calls.count("linear_add") == (2 * layers if folded else 0)
        # unfused: every norm after layer 0's input norm adds the residual first (the final one too)
        assert log.calls.count("fused_add_rms_norm") == (0 if folded else 2 * layers)
        assert log.calls.count("rms_norm") == 1  # folded: the final norm; unfused: layer 0's input norm
    assert torch.equal(fused.kv_cache.tensor, ref.kv_cache.tensor)
