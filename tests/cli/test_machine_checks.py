"""`xrt config validate` runs the checks `run` makes before loading a model (xrt/cli/machine.py): the machine
(CUDA, host memory for cache.l1), the checkpoint (model.path, the tiny checkpoint's cache directory), NIXL's L2
backend and its parameters, the paths run reads and writes; and run stops on each with the same one line, before
any model loads. An unusable cache.l2.path is a warning (the run goes on, L2 storing nothing)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from xrt.cli.main import main

NIXL = ["cache=l1_l2"]


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def _nixl() -> None:
    from xrt.kvstore.nixl_api import NixlUnavailable, nixl_api

    try:
        nixl_api()
    except NixlUnavailable:
        pytest.skip("no NIXL wheel")


def importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import xrt.engine.llm

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(xrt.engine.llm.LLM, "__init__", refuse)


CASES = [
    (["prompts_file=missing.jsonl"], "error: prompts_file: no such file 'missing.jsonl'"),
    (["prompts_file=."], "error: prompts_file: '.' is a directory; expected a JSONL or text file"),
    (["output=missing/o.jsonl"], "error: output: directory "),
    (["model=qwen3"], "error: model.path: empty for model.name=qwen3; set model.path"),
    (["cache=l1", "cache.l1.size_gb=1e9"], "error: cache.l1.size_gb: 1000000000.0 GB of host memory ("),
]
NIXL_CASES = [
    ([*NIXL, "cache.l2.backend=GDS"], "error: cache.l2.backend: GDS: NIXL cannot start this backend here"),
    ([*NIXL, "+cache.l2.backend_params={use_urin: 'true'}"],
     "error: cache.l2.backend_params: use_urin: not a parameter of NIXL's POSIX backend (it takes "),
    ([*NIXL, "cache.l2.backend=OBJ"], "error: cache.l2.backend_params: OBJ needs a bucket: "),
    ([*NIXL, "cache.l2.backend=OBJ", "+cache.l2.backend_params={bucket: b3x, endpont_override: 'x'}"],
     "error: cache.l2.backend_params: endpont_override: not a parameter of NIXL's OBJ backend (it takes "),
]


def _check_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str], line: str) -> None:
    monkeypatch.chdir(tmp_path)
    for command in (["config", "validate"], ["run"]):
        rc, out, err = cli(*command, "device=cpu", *overrides)
        assert rc == 2 and out == "", (command, out)
        assert err.startswith(line) and err.count("\n") == 1, (command, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("overrides", "line"), CASES)
def test_validate_and_run_refuse_alike_before_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      no_model: None, overrides: list[str], line: str) -> None:
    _check_agree(tmp_path, monkeypatch, overrides, line)


@pytest.mark.parametrize(("overrides", "line"), NIXL_CASES)
def test_the_l2_backend_is_checked_before_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_model: None,
                                                  overrides: list[str], line: str) -> None:
    _nixl()
    monkeypatch.delenv("AWS_DEFAULT_BUCKET", raising=False)
    if "GDS" in overrides[-1] and importable("cufile"):
        pytest.skip("GPUDirect Storage may work here")
    _check_agree(tmp_path, monkeypatch, overrides, line)


def test_an_unusable_cache_dir_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("XRT_CACHE_DIR", str(tmp_path / "afile" / "cache"))
    rc, _, err = cli("config", "validate")
    assert rc == 2
    assert err == (f"error: XRT_CACHE_DIR={tmp_path}/afile/cache: {tmp_path}/afile is a file, so the tiny checkpoint "
                   f"cannot be made under {tmp_path}/afile/cache; point XRT_CACHE_DIR at a writable directory\n")
    # where the check cannot see it coming (os.access passes /proc for root), making it says the same
    from xrt.models.checkpoint import CheckpointError, resolve_checkpoint
    from xrt.models.tiny import tiny_model_args

    monkeypatch.setenv("XRT_CACHE_DIR", "/proc/xrt-cache")
    with pytest.raises(CheckpointError, match=r"^XRT_CACHE_DIR=/proc/xrt-cache: cannot write the tiny checkpoint "
                                              r"to /proc/xrt-cache/qwen3-tiny-\w+: .*; point XRT_CACHE_DIR at"):
        resolve_checkpoint(tiny_model_args())


def test_an_unusable_l2_path_is_a_warning_in_validate(tmp_path: Path) -> None:
    _nixl()
    (tmp_path / "afile").write_text("x")
    rc, out, err = cli("config", "validate", *NIXL, f"cache.l2.path={tmp_path}/afile/l2")
    assert rc == 0 and out == "ok\n"
    assert err.startswith(f"warning: cache.l2.path: cannot create {tmp_path}/afile/l2: ")
    assert err.endswith("the L2 tier would store nothing\n")
    rc, out, err = cli("config", "validate", *NIXL, f"cache.l2.path={tmp_path}/new/l2")
    assert (rc, out, err) == (0, "ok\n", "") and list(tmp_path.iterdir()) == [tmp_path / "afile"]  # none left


def test_validate_of_a_sweep_checks_every_job_and_says_what_it_skipped(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, err = cli("config", "validate", "-m", "device=cpu", "prompts_file=a.txt,b.txt")
    assert rc == 2 and out == ""
    assert err.splitlines() == ["error: prompts_file: no such file 'a.txt' [job #0 of 2]",
                                "error: prompts_file: no such file 'b.txt' [job #1 of 2]"]
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    rc, out, err = cli("config", "validate", "-m", "device=cuda", "seed=1,2", "hydra/launcher=submitit_slurm")
    assert rc == 0 and out == "job #0 of 2: device=cuda seed=1: ok\njob #1 of 2: device=cuda seed=2: ok\n"
    assert err.startswith("note: machine checks skipped: ") and "runs the jobs elsewhere" in err
