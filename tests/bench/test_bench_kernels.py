"""The kernels scenario on a CPU machine: it refuses in one line, its shapes follow the model, its attention
reference agrees with xrt's, and its lines make the results.md tables and kernels.png."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from xrt.bench.kernels.attention import PagedProblem
from xrt.bench.kernels.gemv import linear_shapes
from xrt.bench.kernels.timing import Measurement
from xrt.bench.report import regenerate
from xrt.bench.results import write_records
from xrt.cli.main import main
from xrt.config import CacheArgs, ModelArgs, XrtConfig
from xrt.ops import reference

QWEN3_0_6B = ModelArgs(name="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960)
BASE = {"scenario": "kernels", "model": "qwen3", "dtype": "bfloat16", "device_name": "H200", "torch": "2.11",
        "triton": "3.6.0", "flashinfer": "0.6.14", "git_commit": "abc", "bandwidth_gbps": 4200.0, "page_size": 16}


def test_cli_refuses_kernels_without_cuda(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the scenario runs (tests/bench/test_bench_tools_gpu.py)")
    rc = main(["bench", "bench.scenario=kernels", "bench.kernels=[elementwise]", f"bench.out_dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == ["error: bench.scenario: kernels times CUDA kernels and needs a CUDA device; none is available"]
    assert not (tmp_path / "results.jsonl").exists()


def test_cli_names_an_unknown_kernel_group(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "bench.scenario=kernels", "bench.kernels=[gemm]"]) == 2
    assert "bench.kernels[0]" in capsys.readouterr().err


def test_gemv_shapes_are_the_models_linear_layers() -> None:
    assert linear_shapes(QWEN3_0_6B) == {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024),
                                         "down": (1024, 3072), "lm_head": (151936, 1024)}


@pytest.mark.parametrize(("batch", "context", "page"), [(1, 37, 16), (3, 64, 16), (2, 5, 4)])
def test_attention_reference_matches_xrts_paged_attention(batch: int, context: int, page: int) -> None:
    """The dense reference every attention kernel is checked against agrees with xrt's CPU reference op."""
    model = ModelArgs(num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_model_len=128)
    cfg = XrtConfig(model=model, cache=CacheArgs(page_size=page))
    torch.manual_seed(0)
    p = PagedProblem.make(cfg, batch, context, torch.float32, torch.device("cpu"))
    assert p.caches.shape[0] >= 2 and p.indices.unique().numel() == p.indices.numel()
    ours = reference.paged_attention(p.q, p.caches[0], torch.arange(batch + 1, dtype=torch.int32), p.indptr,
                                     p.indices, p.last, p.scale)
    torch.testing.assert_close(p.reference(), ours, rtol=1e-5, atol=1e-5)
    assert p.kv_bytes == batch * context * 2 * 16 * 2 * 4


def _line(group: str, case: str, rows: int, impl: str, role: str, us: float | None, **kw: object) -> dict:
    m = Measurement(group, case, rows, kw.pop("context", None), impl, role, us=us, nbytes=kw.pop("nbytes", None),
                    **kw)  # type: ignore[arg-type]
    return {**BASE, **m.record()}


def test_kernel_lines_make_tables_and_a_plot(tmp_path: Path) -> None:
    lines = [
        _line("gemv", "qkv", 1, "F.linear", "baseline", 9.0, nbytes=8_400_000),
        _line("gemv", "qkv", 1, "fma m1 n8", "default", 6.0, nbytes=8_400_000),
        _line("gemv", "qkv", 1, "fma m1 n2", "candidate", 4.0, nbytes=8_400_000),
        _line("gemv", "qkv", 1, "dot m16", "candidate", None, status="wrong", note="rel err 3.1e-01"),
        _line("gemv", "qkv", 8, "F.linear", "baseline", 5.0),
        _line("gemv", "qkv", 8, "dot m16", "default", 7.0),
        _line("elementwise", "rms_norm", 8, "torch", "baseline", 30.0, timer="do_bench"),
        _line("elementwise", "rms_norm", 8, "triton", "default", 12.0, timer="do_bench"),
        _line("elementwise", "rms_norm", 8, "triton", "default", 10.0, timer="do_bench"),  # a rerun replaces it
        _line("decode_attention", "decode attention", 1, "flashinfer", "baseline", 10.0, context=1024),
        _line("decode_attention", "decode attention", 1, "xrt", "default", 8.0, context=1024),
    ]
    write_records(tmp_path, lines, fresh=True)
    assert regenerate(tmp_path)[1:] == [f"wrote {tmp_path / 'kernels.png'}"]
    assert (tmp_path / "kernels.png").read_bytes()[:4] == b"\x89PNG" and not (tmp_path / "plot.png").exists()
    md = (tmp_path / "results.md").read_text()
    assert "## Kernels: gemv, qwen3, bfloat16, H200" in md and "TTFT" not in md
    # baseline 9 us, xrt 6 us, best 4 us: 1.50x and 2.25x; 8.4 MB in 4 us = 2100 GB/s.
    assert "| qkv | 1 | – | F.linear | 9.00 | 6.00 | fma m1 n2 | 4.00 | 2100 | 1.50× | 2.25× |" in md
    assert "| qkv | 8 | – | F.linear | 5.00 | 7.00 | dot m16 | 7.00 | – | 0.71× | 0.71× |" in md
    assert "| qkv | 1 | – | dot m16 | candidate | – | – | – | WRONG: rel err 3.1e-01 |" in md
    assert "| rms_norm | 8 | – | torch | 30.00 | 10.00 | triton | 10.00 | – | 3.00× | 3.00× |" in md
    assert "| decode attention | 1 | 1024 | flashinfer | 10.00 | 8.00 | xrt | 8.00 |" in md
    assert md.count("| rms_norm | 8 | – | triton |") == 1
