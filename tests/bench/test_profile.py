"""`python -m xrt profile` on a CPU machine: the host mode and the step mode run, the CUDA-only mode and bad
settings stop in one line naming the field, a run leaves nothing of its runner behind."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest
import torch

from xrt.cli.main import main
from xrt.config.compose import load_config
from xrt.executor.runner import ModelRunner
from xrt.profile.host import run_host

CPU = not torch.cuda.is_available()
TINY = ["model=qwen3-tiny", "model.dtype=float32", "device=cpu"]


def _profile(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["profile", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_help_lists_the_profile_fields(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _profile(capsys, "--help")
    assert rc == 0
    assert "profile.mode" in out and "breakdown|step|host" in out and "profile.iters" in out


def test_bad_settings_name_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _profile(capsys, "profile.mode=flame")
    assert rc == 2 and out == ""
    assert err.startswith("error: profile.mode:") and "flame" in err and "host" in err
    rc, out, err = _profile(capsys, "profile.mode=host", "profile.batch=[]")
    assert rc == 2 and out == ""
    assert err.startswith("error: profile.batch: must list at least one batch size")


@pytest.mark.skipif(not CPU, reason="on a CUDA machine the breakdown runs (tests/bench/test_bench_tools_gpu.py)")
def test_breakdown_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _profile(capsys, "profile.mode=breakdown")
    assert rc == 2 and out == ""
    assert err.strip().splitlines() == [
        "error: profile.mode: breakdown needs a CUDA device, and none is available (profile.mode=host and step "
        "run on CPU)"]


def test_host_mode_times_both_stand_ins(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _profile(capsys, "profile.mode=host", "profile.batch=[1,3]", "profile.input_len=40",
                            "profile.iters=6", "profile.warmup=1", "profile.rows=4")
    assert rc == 0, err
    rows = re.findall(r"^\| (execute|launch) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| (.*) \|$", out, re.M)
    assert [(r[0], int(r[1])) for r in rows] == [("execute", 1), ("execute", 3), ("launch", 1), ("launch", 3)]
    for kind, _, median, low, stage in rows:
        assert 0 < float(low) <= float(median)
        assert (stage == "(in step)") == (kind == "launch") and (kind == "launch" or float(stage) > 0)
    assert out.count("cProfile over 6 steps") == 4 and "engine.py" in out


def test_host_mode_stages_every_decode_row() -> None:
    cfg = load_config(["profile.batch=[5]", "profile.input_len=33", "profile.iters=3", "profile.rows=0"],
                      config_name="bench")
    lines: list[str] = []
    results = run_host(cfg, lines.append)
    assert [(r["runner"], r["batch"]) for r in results] == [("execute", 5), ("launch", 5)]
    assert results[0]["stage_decode_us"] > 0 and results[1]["stage_decode_us"] is None
    assert not any("cProfile" in line for line in lines)


def test_step_mode_on_the_tiny_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = _profile(capsys, *TINY, "profile.mode=step", "profile.batch=[2]", "profile.input_len=12",
                            "profile.iters=2", "profile.warmup=1", "profile.rows=3")
    assert rc == 0, err
    assert "## batch 2, input 12" in out and "| forward, host |" in out
    assert re.search(r"### engine: prefill step [\d.]+ ms; decode step median [\d.]+ ms", out)
    assert out.count("Self CPU time total") == 3  # prefill, decode by device, decode by CPU (CPU: both CPU)
    assert re.search(r"^\| qk_norm_rope_store_kv \| [\d.]+ \| [\d.]+ \| -?[\d.]+ \|$", out, re.M)


def test_step_mode_names_a_batch_the_cache_cannot_hold(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _profile(capsys, *TINY, "profile.mode=step", "profile.batch=[3]", "profile.input_len=40",
                          "profile.iters=1", "cache.num_pages=4", "cache.page_size=16")
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        "error: profile.batch: 3 sequences of 40 tokens need 9 KV pages, the cache has 4")


def _runners() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, ModelRunner))


def test_a_run_frees_its_runner(capsys: pytest.CaptureFixture[str]) -> None:
    """A mode's runner sits in reference cycles; left to the collector, its KV cache (most of a GPU, sized from the
    free memory) outlived the run, and a second profile run in the process (the GPU tests make two) found no room.
    With the collector off, only the run's own collection frees it."""
    gc.collect()
    before = _runners()
    gc.disable()
    try:
        rc, _, err = _profile(capsys, "profile.mode=step", *TINY, "profile.batch=[1]", "profile.input_len=16",
                              "profile.iters=1", "profile.warmup=0", "profile.rows=0")
        assert rc == 0, err
        assert _runners() == before
    finally:
        gc.enable()
