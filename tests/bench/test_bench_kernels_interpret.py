"""The kernels scenario's GPU-only measuring code on CPU under TRITON_INTERPRET=1: its inputs, kernel calls and
correctness checks, with a stand-in timer (one call, 1 us) and no device synchronization. Skipped without
triton (CI) and on CUDA machines, where tests/bench/test_bench_tools_gpu.py runs the scenario itself."""

from __future__ import annotations

import pytest
import torch
from interpret_support import Interpreter

INTERPRETER = Interpreter("bench/test_bench_tools_gpu.py")
CPU = torch.device("cpu")


@pytest.fixture
def fake_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    from xrt.bench.kernels import timing

    monkeypatch.setattr(timing, "time_us", lambda fn, graph=True, rep_ms=10: (fn(), 1.0)[1])
    monkeypatch.setattr(timing, "COLD_BYTES", 1)  # two copies of every operand: the interpreter is slow
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)


def _cfg(*overrides: str):  # noqa: ANN202
    from xrt.config.compose import load_config

    return load_config(["model=qwen3-tiny", *overrides], config_name="bench")


@INTERPRETER.in_process
def test_elementwise_kernels_pass_their_checks(fake_timer: None) -> None:
    from xrt.bench.kernels import elementwise

    ms = list(elementwise.run(_cfg("bench.kernel_tokens=[3]"), torch.float32, CPU))
    assert len(ms) == 2 * 7
    assert all(m.status == "ok" and m.us == 1.0 and m.timer == "do_bench" for m in ms), [m for m in ms if m.note]
    assert [m.role for m in ms[:2]] == ["baseline", "default"] and ms[1].impl == "triton"


@INTERPRETER.in_process
def test_decode_attention_as_the_backend_builds_it(fake_timer: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from xrt.bench.kernels import attention

    monkeypatch.setattr(attention, "_variants", lambda heads, kv_heads: {"st32": {"split_tokens": 32}})
    cfg = _cfg("model.max_model_len=64")  # few split programs: each runs in Python here
    p = attention.PagedProblem.make(cfg, 2, 40, torch.float32, CPU)
    base, xrt, st32 = attention.decode_attention(cfg, p)
    assert base.role == "baseline" and base.impl == "flashinfer"  # an error note where flashinfer is missing
    assert (xrt.impl, xrt.role, xrt.status, xrt.note) == ("xrt", "default", "ok", "1 chunks per sequence")
    assert (st32.status, st32.note) == ("ok", "2 chunks per sequence")
    assert p.caches.shape[0] == 2 and xrt.us == 0.5 and xrt.nbytes == p.kv_bytes


@INTERPRETER.in_process
def test_prefill_epilogue_variants_pass_their_checks(fake_timer: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused prefill GEMMs' lines at a shape both take (16-bit, heads of 32; the tiny model's heads of 16 leave
    the qkv case its two unfused lines), each variant checked against cuBLAS + the separate kernel before it is
    timed."""
    from xrt.bench.kernels import prefill_epilogues

    small = {"block_m": 16, "block_k": 32, "num_warps": 4}
    monkeypatch.setattr(prefill_epilogues, "QKV_VARIANTS", {"default": small, "dot per half": {**small,
                                                                                                 "one_dot": False}})
    monkeypatch.setattr(prefill_epilogues, "GATE_UP_VARIANTS", {"default": {**small, "block_n": 16}})
    monkeypatch.setattr(prefill_epilogues, "NORM_VARIANTS", {"default": small})
    monkeypatch.setattr(prefill_epilogues, "RESIDUAL_VARIANTS", {"default": {**small, "block_n": 16}})
    ms = list(prefill_epilogues.run(_cfg("bench.kernel_tokens=[5]", "model.head_dim=32"), torch.bfloat16, CPU))
    pair = [("cuBLAS + separate kernel", "baseline", "ok"), ("cuBLAS GEMM alone", "candidate", "ok")]
    fused = ("fused default", "default", "ok")
    assert [(m.case, m.impl, m.role, m.status) for m in ms] == [
        *(("qkv + norm + rope + kv", *p) for p in pair), ("qkv + norm + rope + kv", *fused),
        ("qkv + norm + rope + kv", "fused dot per half", "candidate", "ok"),
        *(("gate_up + silu_and_mul", *p) for p in pair), ("gate_up + silu_and_mul", *fused),
        *(("rms_norm + qkv + norm + rope + kv", *p) for p in pair), ("rms_norm + qkv + norm + rope + kv", *fused),
        *(("rms_norm + gate_up + silu_and_mul", *p) for p in pair), ("rms_norm + gate_up + silu_and_mul", *fused),
        *(("o_proj + residual add", *p) for p in pair), ("o_proj + residual add", *fused),
        *(("down + residual add", *p) for p in pair), ("down + residual add", *fused)], [m.note for m in ms]
    tiny = [m.case.split()[0] for m in prefill_epilogues.run(_cfg("bench.kernel_tokens=[5]"), torch.bfloat16, CPU)]
    assert tiny == ["qkv", "qkv", "gate_up", "gate_up", "gate_up", "rms_norm", "rms_norm", "rms_norm", "rms_norm",
                    "rms_norm", "o_proj", "o_proj", "o_proj", "down", "down", "down"]


@INTERPRETER.subprocess_only
def test_in_subprocess() -> None:
    INTERPRETER.rerun(__file__)
