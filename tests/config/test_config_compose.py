"""Composing XrtConfig from conf/ with Hydra's Compose API, validated by xrt.reflect."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import xrt
from xrt.config import CacheArgs, DType, ExecutorKind, KVTiers, LoadFormat, LogLevel, ModelArgs, XrtConfig
from xrt.config.compose import compose_overrides, conf_dir, group_options, load_config, unbuilt_options
from xrt.config.sweep import plan_sweep
from xrt.reflect import ConfigError, build, from_hf, json_schema, to_dict

GROUPS = group_options()
# Options of `parallel` are checked against a model whose heads every tp divides.
BASE = {"parallel": ["model=qwen3"]}
HF_SHAPES = {  # published Qwen3 config.json values
    "qwen3-0.6b": (1024, 3072, 28, 16, True),
    "qwen3-1.7b": (2048, 6144, 28, 16, True),
    "qwen3-4b": (2560, 9728, 36, 32, True),
    "qwen3-8b": (4096, 12288, 36, 32, False),
}


def problems_of(overrides: list[str], **kw: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as e:
        load_config(overrides, **kw)
    return dict(e.value.problems)


def test_groups_are_the_documented_ones() -> None:
    assert GROUPS == {
        "cache": ["gpu", "l1", "l1_l2"],
        "executor": ["cudagraph", "eager"],
        "model": ["qwen3", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-tiny"],
        "parallel": ["tp1", "tp2", "tp4", "tp8"],
    }
    assert conf_dir().name == "conf"


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_group_option_composes_validates_and_round_trips(group: str, option: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    cfg = load_config([*BASE.get(group, []), f"{group}={option}"])
    assert isinstance(cfg, XrtConfig)
    dumped = to_dict(cfg)
    assert build(XrtConfig, dumped) == cfg
    assert build(XrtConfig, json.loads(json.dumps(dumped))) == cfg
    jsonschema.validate(dumped, json_schema(XrtConfig))
    if group == "parallel":
        assert cfg.parallel.tp == int(option[2:])
    if group == "executor":
        assert cfg.executor.kind is ExecutorKind(option)
    if group == "model":
        assert cfg.model.name == option
    if group == "cache":
        assert cfg.cache.tiers is KVTiers(option)


def test_defaults_are_the_tiny_eager_single_gpu_config() -> None:
    cfg = load_config([])
    assert cfg.model.name == "qwen3-tiny"
    assert (cfg.model.vocab_size, cfg.model.hidden_size, cfg.model.intermediate_size) == (2048, 64, 128)
    assert (cfg.model.num_hidden_layers, cfg.model.num_attention_heads, cfg.model.num_key_value_heads) == (3, 4, 2)
    assert (cfg.model.head_dim, cfg.model.rope_theta, cfg.model.max_position_embeddings) == (16, 10000.0, 2048)
    assert cfg.model.tie_word_embeddings and cfg.model.max_model_len == 1024
    assert cfg.executor.kind is ExecutorKind.EAGER and cfg.parallel.tp == 1
    assert cfg.cache == CacheArgs() and cfg.log_level is LogLevel.INFO


@pytest.mark.parametrize("name", sorted(HF_SHAPES))
def test_model_options_have_the_published_shapes(name: str) -> None:
    m = load_config([f"model={name}"]).model
    hidden, inter, layers, heads, tied = HF_SHAPES[name]
    assert (m.hidden_size, m.intermediate_size, m.num_hidden_layers, m.num_attention_heads) == (
        hidden, inter, layers, heads)
    assert (m.vocab_size, m.num_key_value_heads, m.head_dim, m.tie_word_embeddings) == (151936, 8, 128, tied)
    assert (m.rope_theta, m.max_position_embeddings, m.rms_norm_eps, m.max_model_len) == (1e6, 40960, 1e-6, 4096)


def test_qwen3_is_the_0_6b_shape() -> None:
    a, b = load_config(["model=qwen3"]).model, load_config(["model=qwen3-0.6b"]).model
    assert to_dict(a) | {"name": ""} == to_dict(b) | {"name": ""}


def test_overrides_of_fields_and_groups() -> None:
    cfg = load_config(["model=qwen3", "executor=cudagraph", "parallel.tp=2", "cache=gpu", "cache.page_size=32",
                       "bench.batch=8", "sampling.stop=[a,b]", "sampling.seed=3", "model.dtype=BFLOAT16",
                       "executor.pdl=false", "log_level=debug"])
    assert cfg.model.num_hidden_layers == 28 and cfg.executor.kind is ExecutorKind.CUDAGRAPH
    assert cfg.parallel.tp == 2 and cfg.cache.page_size == 32 and not cfg.executor.pdl
    assert cfg.bench.batch == [8] and cfg.sampling.stop == ["a", "b"] and cfg.sampling.seed == 3
    assert cfg.model.dtype is DType.BFLOAT16 and cfg.log_level is LogLevel.DEBUG


def test_cudagraph_captures_every_decode_batch_the_scheduler_forms() -> None:
    """A decode step above the largest graph runs eager (host-bound): the cudagraph option ties the two."""
    assert load_config(["executor=cudagraph"]).executor.max_batch == load_config([]).scheduler.max_num_seqs
    cfg = load_config(["executor=cudagraph", "scheduler.max_num_seqs=512"])
    assert cfg.executor.max_batch == 512
    lowered = load_config(["executor=cudagraph", "scheduler.max_num_seqs=512", "executor.max_batch=64"])
    assert lowered.executor.max_batch == 64


def test_an_unbuilt_option_stops_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group option for a part not built yet holds `_unbuilt: "<why>"`: selecting it stops with that line."""
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "cache" / "l3.yaml").write_text('_unbuilt: "cache=l3: the L3 KV tier is not built yet"\n')
    monkeypatch.setenv("XRT_CONF_DIR", str(conf))
    with pytest.raises(ConfigError) as e:
        load_config(["cache=l3"])
    assert e.value.lines() == ["cache=l3: the L3 KV tier is not built yet"]
    assert unbuilt_options(conf) == {("cache", "l3")}


@pytest.mark.parametrize("where,what", [("missing", "does not exist"), ("empty", "holds no config.yaml")])
def test_an_xrt_conf_dir_that_is_no_conf_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str,
                                                        what: str) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("XRT_CONF_DIR", str(tmp_path / where))
    with pytest.raises(ConfigError) as e:
        load_config([])
    assert e.value.lines() == [f"XRT_CONF_DIR={tmp_path / where}: {what}; point it at a conf/ directory (with "
                               "config.yaml) or unset it"]


def test_a_prompt_given_with_a_prompts_file_is_refused() -> None:
    assert problems_of(["prompt=Hi", "prompts_file=p.jsonl"]) == {
        "prompt": "given together with prompts_file='p.jsonl', whose lines are the prompts; give one of them"}
    assert load_config(["prompts_file=p.jsonl"]).prompts_file == "p.jsonl"  # the default prompt is no conflict


def test_bench_config_is_the_seed_protocol() -> None:
    cfg = load_config([], config_name="bench")
    assert cfg.model.name == "qwen3" and cfg.model.hidden_size == 1024 and cfg.model.num_hidden_layers == 28
    assert cfg.model.load_format is LoadFormat.DUMMY and cfg.model.dtype is DType.BFLOAT16
    assert cfg.bench.batch == [1, 2, 3, 5, 7, 8, 13, 16, 31, 47, 100]
    assert (cfg.bench.input_len, cfg.bench.output_len) == (1024, 256)
    assert cfg.model.max_model_len >= cfg.bench.input_len + cfg.bench.output_len
    assert load_config(["executor=cudagraph"], config_name="bench").executor.kind is ExecutorKind.CUDAGRAPH


def test_python_api_is_the_same_composition() -> None:
    assert xrt.load_config is load_config
    assert xrt.load_config(["model=qwen3-4b"]) == load_config(["model=qwen3-4b"])


def test_the_composer_is_library_code_without_the_cli() -> None:
    import subprocess
    import sys

    code = ("import sys, xrt; xrt.load_config(['model=qwen3']); "
            "print(sorted(m for m in sys.modules if m.startswith(('xrt.cli', 'torch'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr


def test_errors_name_the_field_and_are_all_reported_at_once() -> None:
    found = problems_of(["mdoel.name=x", "executor.kind=fast", "cache.kv_size_gb=-1", "+new.key=1", "tp=2",
                         "cache.l3.size_gb=8"])
    assert found["mdoel.name"] == "unknown field; did you mean model.name?"
    assert found["executor.kind"] == "must be one of eager, cudagraph, got 'fast'"
    assert found["cache.kv_size_gb"] == "must be > 0, got -1"
    assert found["cache.l3.size_gb"].startswith("unknown field")
    assert found["new.key"].startswith("unknown field")
    assert found["tp"] == "unknown field; did you mean parallel.tp?"


def test_cross_field_rules_still_run_when_a_section_has_field_errors() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(["cache.kv_size_gb=-1", "parallel.tp=3", "model.max_model_len=0"])
    assert {"cache.kv_size_gb: must be > 0, got -1", "model.max_model_len: must be > 0, got 0",
            "parallel.tp: must divide model.num_attention_heads=4, got 3"} <= set(e.value.lines())
    # a rule that would divide by an invalid value adds nothing to that value's own line
    assert problems_of(["parallel.tp=0", "model.num_key_value_heads=0"]) == {
        "model.num_key_value_heads": "must be > 0, got 0", "parallel.tp": "must be >= 1, got 0"}


def test_hydra_level_errors_become_problems() -> None:
    assert "available: qwen3, qwen3-0.6b" in problems_of(["model=qwen5"])["model"]
    assert "cannot parse" in problems_of(["seed=["])["seed"]
    assert "add -m" in problems_of(["executor=eager,cudagraph"])["executor"]
    assert "bench.batch=[1,8]" in problems_of(["bench.batch=1,8"])["bench.batch"]
    assert "nope" in problems_of(["seed=${nope}"])["seed"]
    assert "no config 'nope'" in problems_of([], config_name="nope")["--config-name"]


def test_composing_leaves_logging_and_cwd_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    load_config(["model=qwen3"])
    assert (list(root.handlers), root.level) == before
    assert list(tmp_path.iterdir()) == []


def jobs_of(overrides: list[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper will launch for `-m` with these overrides, in its order."""
    return plan_sweep(overrides, "config", "run").jobs


def test_multirun_over_a_group_and_a_switch_gives_one_valid_config_per_job() -> None:
    jobs = jobs_of(["executor=eager,cudagraph", "executor.pdl=false,true", "seed=5"])
    assert jobs[0] == ["executor=eager", "executor.pdl=False", "seed=5"] and len(jobs) == 4
    cfgs = [compose_overrides(job, "config") for job in jobs]
    got = {(c.executor.kind.value, c.executor.pdl) for c in cfgs}
    assert got == {(k, f) for k in ("eager", "cudagraph") for f in (False, True)}
    assert all(c.seed == 5 for c in cfgs)
    assert jobs_of(["bench.batch=1,8", "parallel=glob([tp1,tp2])"]) == [
        ["bench.batch=1", "parallel=tp1"], ["bench.batch=1", "parallel=tp2"],
        ["bench.batch=8", "parallel=tp1"], ["bench.batch=8", "parallel=tp2"]]
    assert jobs_of(["seed=range(0,3)"]) == [["seed=0"], ["seed=1"], ["seed=2"]]
    assert jobs_of([]) == [[]]


def write_hf_config(directory: Path, **kw: object) -> dict:
    transformers = pytest.importorskip("transformers")
    shape = dict(vocab_size=1000, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=16, rope_theta=5000.0, rms_norm_eps=1e-5,
                 max_position_embeddings=512, tie_word_embeddings=False)
    shape.update(kw)
    transformers.Qwen3Config(**shape).save_pretrained(str(directory))
    return json.loads((directory / "config.json").read_text())


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("hf_qwen3")
    return d, write_hf_config(d)


def test_model_args_from_a_real_hf_qwen3_config(hf_dir: tuple[Path, dict]) -> None:
    _, data = hf_dir
    m = from_hf(ModelArgs, data, base={"max_model_len": 256})
    assert (m.vocab_size, m.hidden_size, m.intermediate_size, m.num_hidden_layers) == (1000, 96, 160, 2)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (6, 2, 16)
    assert m.rope_theta == 5000.0  # transformers 5 writes it under rope_parameters
    assert (m.rms_norm_eps, m.max_position_embeddings, m.tie_word_embeddings) == (1e-5, 512, False)
    assert m.max_model_len == 256 and m.name == "qwen3-tiny"


def test_model_path_fills_the_shape_and_explicit_overrides_win(hf_dir: tuple[Path, dict]) -> None:
    d, _ = hf_dir
    cfg = load_config([f"model.path={d}", "model.max_model_len=300", "model.num_hidden_layers=1"])
    m = cfg.model
    assert m.path == str(d) and m.hidden_size == 96 and m.num_attention_heads == 6 and m.rope_theta == 5000.0
    assert m.num_hidden_layers == 1 and m.max_model_len == 300 and m.tie_word_embeddings is False
    # not set: the composed max_model_len (tiny: 1024, qwen3: 4096) capped by the checkpoint's 512 positions
    assert load_config([f"model.path={d}"]).model.max_model_len == 512
    assert load_config(["model=qwen3", f"model.path={d}"]).model.max_model_len == 512
    assert load_config([f"model.path={d}", "model.max_model_len=128"]).model.max_model_len == 128
    # set explicitly, it is checked against the checkpoint's positions
    found = problems_of([f"model.path={d}", "model.max_model_len=1024"])
    assert found["model.max_model_len"] == "must be <= max_position_embeddings=512, got 1024"


def test_model_path_problems_name_the_file(tmp_path: Path) -> None:
    assert "no such directory" in problems_of([f"model.path={tmp_path / 'nope'}"])["model.path"]
    assert f"{tmp_path / 'config.json'}: not found" in problems_of([f"model.path={tmp_path}"])["model.path"]
    (tmp_path / "config.json").write_text("{not json")
    assert "not valid JSON" in problems_of([f"model.path={tmp_path}"])["model.path"]
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": "wide", "num_attention_heads": 4}))
    msg = problems_of([f"model.path={tmp_path}"])["model.hidden_size"]
    assert "must be an integer, got 'wide'" in msg and str(tmp_path / "config.json") in msg


def test_works_inside_an_already_initialized_hydra(tmp_path: Path) -> None:
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        assert load_config(["model=qwen3"]).model.name == "qwen3"
        outer = GlobalHydra.instance()
        assert outer.is_initialized()
        assert str(tmp_path) in str(outer.config_loader().get_search_path())  # the caller's Hydra is back
