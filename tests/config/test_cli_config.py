"""`python -m xrt ...` through the real CLI in a subprocess: exit codes, one clean line per problem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def xrt(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("XRT_DEBUG", None) if not env or "XRT_DEBUG" not in env else None
    return subprocess.run([sys.executable, "-m", "xrt", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=120)


BAD = [
    # (name, overrides, dotted field that must be named, text the message must contain)
    ("unknown key", ["foo=1"], "foo", "unknown field"),
    ("typo'd key", ["model.hiden_size=8"], "model.hiden_size", "did you mean model.hidden_size?"),
    ("typo'd group", ["exector=cudagraph"], "exector", "did you mean executor?"),
    ("wrong type", ["model.hidden_size=wide"], "model.hidden_size", "must be an integer, got 'wide'"),
    ("wrong type bool", ["cache.prefix_caching=maybe"], "cache.prefix_caching", "must be true or false"),
    ("wrong type list", ["bench.batch=[1,x]"], "bench.batch[1]", "must be an integer, got 'x'"),
    ("bad enum", ["executor.kind=fast"], "executor.kind", "must be one of eager, cudagraph, got 'fast'"),
    ("bad enum log_level", ["log_level=loud"], "log_level", "must be one of debug, info, warning, error"),
    ("bad group option", ["model=qwen5"], "model", "available: qwen3, qwen3-0.6b"),
    ("out of range", ["cache.kv_size_gb=-1"], "cache.kv_size_gb", "must be > 0, got -1"),
    ("out of range util", ["cache.max_memory_utilization=1.5"], "cache.max_memory_utilization", "in (0.0, 1.0]"),
    ("out of range rows", ["executor.pdl_max_rows=-1"], "executor.pdl_max_rows", "must be >= 0, got -1"),
    ("unknown nested field", ["cache.l3.size_gb=8"], "cache.l3.size_gb", "did you mean cache.l2.size_gb?"),
    ("chunk not whole pages", ["cache.chunk_tokens=20"], "cache.chunk_tokens", "multiple of cache.page_size=16"),
    ("tiers need prefix caching", ["cache=l1", "cache.prefix_caching=false"], "cache.prefix_caching", "must be true"),
    ("not power of two", ["cache.page_size=12"], "cache.page_size", "power of two, got 12"),
    ("+new.key", ["+new.key=1"], "new.key", "unknown field"),
    ("+model.new", ["+model.new_thing=1"], "model.new_thing", "unknown field"),
    ("parse error", ["bench.batch=[oops"], "bench.batch", "cannot parse"),
    ("sweep without -m", ["executor=eager,cudagraph"], "executor", "add -m"),
    ("missing interpolation", ["model.name='${nope}'"], "model.name", "nope"),
    # every cross-field rule of xrt/config/schema.py
    ("kv heads divide heads", ["model.num_key_value_heads=3"], "model.num_key_value_heads",
     "must divide num_attention_heads=4, got 3"),
    ("max_model_len", ["model.max_model_len=4096"], "model.max_model_len",
     "must be <= max_position_embeddings=2048, got 4096"),
    ("buckets", ["executor.buckets=[1,512]"], "executor.buckets", "must all be <= max_batch=256, got 512"),
    ("cudagraph buckets", ["executor=cudagraph", "scheduler.max_num_seqs=64", "executor.buckets=[1,96]"],
     "executor.buckets", "must all be <= max_batch=64, got 96"),
    ("bench lens", ["bench.min_len=2000"], "bench.min_len", "must be <= max_len=1024, got 2000"),
    ("tp divides heads", ["parallel.tp=3"], "parallel.tp", "must divide model.num_attention_heads=4, got 3"),
    ("tp vs kv heads", ["model.num_attention_heads=12", "model.num_key_value_heads=4", "parallel.tp=6"],
     "parallel.tp", "must divide model.num_key_value_heads=4 or be a multiple of it, got 6"),
    ("batched tokens", ["scheduler.max_batched_tokens=8"], "scheduler.max_batched_tokens",
     "must be >= cache.page_size=16"),
]


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """Every BAD case run once, a few at a time (each is a fresh interpreter)."""

    def one(case: tuple) -> tuple[subprocess.CompletedProcess[str], Path]:
        cwd = tmp_path_factory.mktemp("cwd")
        return xrt("config", "validate", *case[1], cwd=cwd), cwd

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip([b[0] for b in BAD], pool.map(one, BAD), strict=True))


@pytest.mark.parametrize("name,overrides,path,text", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exits_2_with_one_clean_line(name: str, overrides: list[str], path: str, text: str,
                                               bad_runs: dict) -> None:
    r, tmp_path = bad_runs[name]
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert any(line.startswith(f"error: {path}: ") and text in line for line in lines), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_all_problems_in_one_run(tmp_path: Path) -> None:
    r = xrt("config", "show", "mdoel.name=x", "executor.kind=fast", "cache.kv_size_gb=-1", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: mdoel.name: unknown field; did you mean model.name?",
        "error: executor.kind: must be one of eager, cudagraph, got 'fast'",
        "error: cache.kv_size_gb: must be > 0, got -1",
    ]


def test_xrt_debug_shows_the_traceback(tmp_path: Path) -> None:
    r = xrt("config", "validate", "cache.kv_size_gb=-1", cwd=tmp_path, env={"XRT_DEBUG": "1"})
    assert r.returncode == 2 and "Traceback" in r.stderr and "cache.kv_size_gb" in r.stderr


def test_show_prints_the_validated_yaml_and_creates_no_outputs(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    start = time.perf_counter()
    r = xrt("config", "show", "model=qwen3", "executor=cudagraph", "parallel.tp=2", cwd=tmp_path)
    elapsed = time.perf_counter() - start
    print(f"python -m xrt config show: {elapsed:.2f} s")
    assert r.returncode == 0, r.stderr
    shown = yaml.safe_load(r.stdout)
    assert shown["model"]["name"] == "qwen3" and shown["model"]["num_hidden_layers"] == 28
    assert shown["executor"]["kind"] == "cudagraph" and shown["parallel"]["tp"] == 2
    assert list(tmp_path.iterdir()) == []  # no outputs/, no .hydra/


def test_show_json_validate_schema_fields(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    shown = json.loads(xrt("config", "show", "--json", "executor.pdl=false", cwd=tmp_path).stdout)
    schema = json.loads(xrt("config", "schema", cwd=tmp_path).stdout)
    jsonschema.validate(shown, schema)
    assert shown["executor"]["pdl"] is False and shown["log_level"] == "info"
    assert xrt("config", "validate", cwd=tmp_path).stdout == "ok\n"
    fields = xrt("config", "fields", cwd=tmp_path).stdout
    assert "log_level" in fields and "debug|info|warning|error" in fields and "model.rope_theta" in fields


def test_multirun_composes_one_valid_config_per_job(tmp_path: Path) -> None:
    # (validate runs run's machine checks: no executor=cudagraph on CPU, dummy weights for a model without a path)
    r = xrt("config", "validate", "-m", "seed=1,2", "model=qwen3-tiny,qwen3-8b", "model.load_format=dummy",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "job #0 of 4: seed=1 model=qwen3-tiny model.load_format=dummy: ok",
        "job #1 of 4: seed=1 model=qwen3-8b model.load_format=dummy: ok",
        "job #2 of 4: seed=2 model=qwen3-tiny model.load_format=dummy: ok",
        "job #3 of 4: seed=2 model=qwen3-8b model.load_format=dummy: ok",
    ]
    r = xrt("config", "validate", "-m", "parallel=tp2,tp8", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == ("error: parallel.tp: must divide model.num_attention_heads=4, got 8 "
                                        "[job #1 of 2]")
    assert list(tmp_path.iterdir()) == []


def test_help_lists_commands_groups_and_reflected_fields(tmp_path: Path) -> None:
    r = xrt("--help", cwd=tmp_path)
    assert r.returncode == 0
    for text in ("run", "bench", "serve", "config", "qwen3-8b", "executor.skinny_gemm_max_rows", "sampling.top_p",
                 "key/value heads (GQA)", "-v, --verbose", "-q, --quiet", "XRT_DEBUG", "XRT_CACHE_DIR", "XRT_CONF_DIR",
                 "XRT_GIT_COMMIT", "TRITON_INTERPRET", "gpu, l1, l1_l2\n"):
        assert text in r.stdout


def test_each_command_has_its_own_help(tmp_path: Path) -> None:
    full = xrt("--help", cwd=tmp_path).stdout
    helps = {}
    for command in ("run", "bench", "profile", "serve", "config"):
        r = xrt(command, "--help", cwd=tmp_path)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert r.stdout.startswith(f"usage: python -m xrt {command} ")
        helps[command] = r.stdout
        assert len(r.stdout.splitlines()) < len(full.splitlines()) / 2  # focused: not the global help
        assert "model.*" in r.stdout and "model.hidden_size" not in r.stdout  # shared sections by name only
    fields = {c: {ln.split()[0] for ln in h.splitlines() if ln[:1].isalpha() and "." in ln.split()[0]}
              for c, h in helps.items()}
    run = helps["run"]
    assert "\noutput " in run and "\nprompts_file " in run and "output_overwrite" in run and "\nseed " in run
    assert "bench.batch" not in fields["run"] and "serve.port" not in run
    assert "bench.batch" in fields["bench"] and "prompts_file" not in helps["bench"].split("fields of bench")[1]
    assert "serve.port" in fields["serve"] and "-m, --multirun" not in helps["serve"]
    assert "profile.mode" in fields["profile"] and "bench.*" in helps["profile"]
    assert "validate check the config" in helps["config"] and "--json" in helps["config"]
    assert all(f in full for fs in fields.values() for f in fs)  # the global help still lists every field


@pytest.mark.parametrize("args,text", [
    ((), "no command given"),
    (("confg",), "did you mean config?"),
    (("config",), "no action given"),
    (("config", "shwo"), "did you mean show?"),
    (("config", "show", "--bogus"), "unknown option '--bogus'"),
    (("config", "schema", "seed=1"), "takes no overrides"),
])
def test_usage_errors_exit_2(args: tuple[str, ...], text: str, tmp_path: Path) -> None:
    r = xrt(*args, cwd=tmp_path)
    assert r.returncode == 2 and text in r.stderr and "Traceback" not in r.stderr


def test_installed_layout_finds_conf_inside_the_package(tmp_path: Path) -> None:
    """The wheel force-includes conf/ as xrt/conf; a copy laid out that way composes the same groups."""
    import shutil

    site = tmp_path / "site"
    shutil.copytree(REPO / "xrt", site / "xrt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "conf", site / "xrt" / "conf")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("XRT_CONF_DIR", None)
    code = "from xrt.config.compose import conf_dir; print(conf_dir())"
    found = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
    assert found.stdout.strip() == str(site / "xrt" / "conf"), found.stderr
    r = subprocess.run([sys.executable, "-m", "xrt", "config", "validate", "model=qwen3-8b", "parallel=tp8",
                        "model.load_format=dummy"],
                       cwd=work, env=env, capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
    assert list(work.iterdir()) == []
