"""The kernels scenario and the profile command on a GPU, at small settings: every comparison runs, checks
and times its implementations, and every profile mode prints its report."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from xrt.cli.main import main

SMALL = ["bench.kernel_tokens=[1]", "bench.batch=[1]", "bench.context_len=[64]"]


def test_kernels_scenario_checks_and_times_every_group(
    device: torch.device, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("needs flashinfer")
    rc = main(["bench", "bench.scenario=kernels", *SMALL, f"bench.out_dir={tmp_path}"])
    assert rc == 0, capsys.readouterr().err
    lines = [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    groups = {x["group"] for x in lines}
    assert groups == {"elementwise", "gemv", "decode_attention", "flashinfer"}
    for group in groups:
        mine = [x for x in lines if x["group"] == group]
        assert any(x["role"] == "baseline" and x["us"] for x in mine), group
        # What xrt runs (the flashinfer group's baseline is xrt's own setting) must be correct.
        assert all(x["status"] == "ok" and x["us"] > 0 for x in mine if x["role"] in ("baseline", "default")), mine
    md = (tmp_path / "results.md").read_text()
    assert md.count("## Kernels:") == 4


@pytest.mark.parametrize("mode", ["breakdown", "step"])
def test_profile_modes_report(device: torch.device, mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["profile", f"profile.mode={mode}", "executor=cudagraph", "profile.batch=[1,3]",
               "profile.input_len=64", "profile.iters=3", "profile.warmup=1", "profile.rows=5"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "## batch 3" in out
    if mode == "breakdown":
        assert "decode graph replay" in out and "### decode kernels (graph replay)" in out
    else:
        assert "forward, device" in out and "### engine: prefill step" in out
