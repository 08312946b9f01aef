"""A checkpoint that cannot be right is refused with one line naming the file and the tensor or key, through the
Python API (`xrt.load_config`, `xrt.LLM`) and the CLI (exit 2, one `error:` line, no traceback); a checkpoint given
by model.path alone (a directory or a Hub id in the local Hugging Face cache) sets the model's shape and name.
Bad checkpoints are copies of the real tiny one (tests/conftest.py), corrupted one way each."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import xrt
from xrt.checkpoint.errors import CheckpointError
from xrt.models.tensor_checks import check_finite
from xrt.reflect import ConfigError

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = "model.safetensors"
DOWN = "model.layers.0.mlp.down_proj.weight"
REPO_ID = "tiny-org/qwen3-tiny"
REVISION = "0123456789abcdef0123456789abcdef01234567"
# A small KV cache: the default (cache.kv_size_gb) is sized for real runs.
SMALL = ["cache.num_pages=16", "device=cpu"]


# -- building bad checkpoints -------------------------------------------------------------------------------------


def copy_checkpoint(src: str, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_tensors(ckpt: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(str(ckpt / WEIGHTS))
    edit(tensors)
    save_file(tensors, str(ckpt / WEIGHTS), metadata={"format": "pt"})


def edit_config(ckpt: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads((ckpt / "config.json").read_text())
    edit(data)
    (ckpt / "config.json").write_text(json.dumps(data, indent=2))


def set_value(name: str, index: tuple[int, ...], value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[name].clone()
        tensors[name][index] = value

    return edit


def as_int32(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[name].to(torch.int32)

    return edit


def drop_keys(*keys: str) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        for key in keys:
            data.pop(key)

    return edit


def write_sharded(ckpt: Path, shards: int) -> None:
    """Spread model.safetensors over `shards` files with an index, as HF writes large models."""
    tensors = load_file(str(ckpt / WEIGHTS))
    os.remove(ckpt / WEIGHTS)
    names, weight_map = sorted(tensors), {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in names[i::shards]}, str(ckpt / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in names[i::shards]})
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def hub_cache(root: Path, repo_id: str, src: str) -> Path:
    """`src`'s files in Hugging Face's cache layout, as `hf download` leaves them: content-addressed blobs, a
    snapshot of symlinks to them, and refs/main naming the snapshot's revision. Returns the snapshot."""
    org, name = repo_id.split("/")
    repo = root / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(os.listdir(src)):
        data = Path(src, file).read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / file).symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture(scope="module")
def hf_cache(tiny_checkpoint: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(cache root, snapshot) holding the tiny checkpoint as REPO_ID; huggingface_hub itself must see it."""
    hub = pytest.importorskip("huggingface_hub")
    root = tmp_path_factory.mktemp("hf_hub_cache")
    snapshot = hub_cache(root, REPO_ID, tiny_checkpoint)
    (cached,) = hub.scan_cache_dir(root).repos
    assert cached.repo_id == REPO_ID and [r.commit_hash for r in cached.revisions] == [REVISION]
    assert hub.snapshot_download(REPO_ID, cache_dir=str(root), local_files_only=True) == str(snapshot)
    return root, snapshot


@pytest.fixture
def use_hf_cache(hf_cache: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point huggingface_hub at the test cache (what HF_HUB_CACHE does at its import); returns the snapshot."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_cache[0]))
    return hf_cache[1]


def problems_of(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as e:
        xrt.load_config(overrides)
    return dict(e.value.problems)


def llm_error(ckpt: Path | str, *overrides: str) -> str:
    """The one-line CheckpointError that building an LLM for the checkpoint raises."""
    cfg = xrt.load_config([f"model.path={ckpt}", *SMALL, *overrides])
    with pytest.raises(CheckpointError) as e:
        xrt.LLM(cfg)
    message = str(e.value)
    assert "\n" not in message
    return message


# -- tensors: dtype and finiteness --------------------------------------------------------------------------------


def test_integer_tensor_is_refused_naming_file_and_tensor(tiny_checkpoint: str, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "int32")
    edit_tensors(ckpt, as_int32(DOWN))
    assert llm_error(ckpt) == (
        f"{ckpt / WEIGHTS}: tensor {DOWN} has dtype int32, expected floating point (float32, bfloat16 or float16)"
    )


@pytest.mark.parametrize(
    ("name", "index", "value"),
    [
        ("model.layers.1.self_attn.k_proj.weight", (3, 5), float("nan")),  # fused into qkv_proj: still named
        ("model.embed_tokens.weight", (2047, 63), float("inf")),  # the very last element: every value is checked
        ("model.norm.weight", (0,), float("-inf")),
    ],
)
def test_non_finite_values_are_refused_naming_the_tensor(
    tiny_checkpoint: str, tmp_path: Path, name: str, index: tuple[int, ...], value: float
) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "nonfinite")
    edit_tensors(ckpt, set_value(name, index, value))
    at = ", ".join(map(str, index))
    assert llm_error(ckpt) == (
        f"{ckpt / WEIGHTS}: tensor {name} holds 1 NaN/inf value(s), the first at [{at}]; expected finite weights"
    )


def test_non_finite_value_in_a_shard_names_the_shard(tiny_checkpoint: str, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "sharded")
    edit_tensors(ckpt, set_value(DOWN, (1, 2), float("nan")))
    write_sharded(ckpt, shards=3)
    shard = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"][DOWN]
    assert llm_error(ckpt).startswith(f"{ckpt / shard}: tensor {DOWN} holds 1 NaN/inf value(s)")


def test_finite_float16_whose_sum_overflows_still_passes() -> None:
    # The check's fast path is one sum per tensor; a sum past float16's range must fall back to the exact check.
    weight = torch.full((64,), 60000.0, dtype=torch.float16)
    assert not torch.isfinite(weight.sum())
    check_finite("model.safetensors", "model.norm.weight", weight)
    weight[7] = float("nan")
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight holds 1 NaN/inf value\(s\), the first at \[7\]"):
        check_finite("model.safetensors", "model.norm.weight", weight)


def test_misshapen_and_missing_tensors_name_their_file(tiny_checkpoint: str, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "shape")
    edit_tensors(ckpt, lambda t: t.update({DOWN: t[DOWN][:, :64].contiguous()}))
    assert llm_error(ckpt) == f"{ckpt / WEIGHTS}: tensor {DOWN}: expected shape (64, 128), got (64, 64)"
    sharded = copy_checkpoint(tiny_checkpoint, tmp_path / "missing")
    edit_tensors(sharded, lambda t: t.pop(DOWN))
    write_sharded(sharded, shards=2)
    # not in any shard: the index is the file that should have listed it
    assert llm_error(sharded) == (
        f"{sharded / 'model.safetensors.index.json'}: tensor {DOWN}: missing from checkpoint")


# -- config.json --------------------------------------------------------------------------------------------------


def test_config_json_without_shape_keys_is_refused(tiny_checkpoint: str, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "nokeys")
    edit_config(ckpt, drop_keys("hidden_size", "num_key_value_heads", "head_dim"))
    expected = (f"{ckpt / 'config.json'}: missing hidden_size, num_key_value_heads, head_dim; a checkpoint's "
                "config.json must give the model's shape")
    assert problems_of([f"model.path={ckpt}"]) == {"model.path": expected}
    # under any group: model=qwen3-0.6b's hidden_size=1024 is not this checkpoint's either
    assert problems_of(["model=qwen3-0.6b", f"model.path={ckpt}"]) == {"model.path": expected}
    # set on the command line, a key is given
    cfg = xrt.load_config([f"model.path={ckpt}", "model.hidden_size=64", "model.num_key_value_heads=2",
                           "model.head_dim=16"])
    assert (cfg.model.hidden_size, cfg.model.num_key_value_heads, cfg.model.head_dim) == (64, 2, 16)


def test_code_built_config_and_config_json_without_shape_keys(tiny_checkpoint: str, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "nohead")
    cfg = xrt.load_config([f"model.path={ckpt}", *SMALL])
    edit_config(ckpt, drop_keys("head_dim"))  # after composing: the runner checks config.json itself
    with pytest.raises(CheckpointError, match=f"^{ckpt / 'config.json'}: missing head_dim; "):
        xrt.LLM(cfg)
    edit_config(ckpt, lambda c: c.update(head_dim=16))
    edit_config(ckpt, drop_keys("tie_word_embeddings"))
    with pytest.raises(CheckpointError) as e:  # compared with what transformers would take for the missing key
        xrt.LLM(cfg)
    assert str(e.value) == (f"model.tie_word_embeddings: True does not match False (transformers' default: "
                            f"{ckpt / 'config.json'} has no such key)")


def test_missing_optional_keys_take_transformers_defaults(tiny_checkpoint: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "defaults")
    optional = ("rope_theta", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings")
    edit_config(ckpt, drop_keys(*optional))
    model = xrt.load_config([f"model.path={ckpt}"]).model
    reference = transformers.AutoConfig.from_pretrained(str(ckpt))
    theta = getattr(reference, "rope_theta", None) or reference.rope_parameters["rope_theta"]
    assert model.rope_theta == theta
    assert (model.rms_norm_eps, model.max_position_embeddings, model.tie_word_embeddings) == (
        reference.rms_norm_eps, reference.max_position_embeddings, reference.tie_word_embeddings)
    # transformers unties the embeddings, so the tied tiny checkpoint now lacks lm_head.weight
    assert llm_error(ckpt) == f"{ckpt / WEIGHTS}: tensor lm_head.weight: missing from checkpoint"


def test_config_json_values_that_contradict_are_blamed_on_the_file(tiny_checkpoint: str, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "contradict")
    edit_config(ckpt, lambda c: c.update(num_key_value_heads=3, rms_norm_eps=0))
    found = problems_of([f"model.path={ckpt}"])
    file = ckpt / "config.json"
    assert found["model.num_key_value_heads"] == f"must divide num_attention_heads=4, got 3 (in {file})"
    assert found["model.rms_norm_eps"] == f"must be > 0, got 0 (in {file})"


def test_an_explicit_shape_that_contradicts_config_json_is_refused_at_load(tiny_checkpoint: str) -> None:
    assert llm_error(tiny_checkpoint, "model.num_hidden_layers=2") == (
        f"model.num_hidden_layers: 2 does not match 3 in {os.path.join(tiny_checkpoint, 'config.json')}")


def test_tokenizer_larger_than_the_vocabulary_is_refused(tiny_checkpoint: str, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "smallvocab")
    edit_tensors(ckpt, lambda t: t.update({"model.embed_tokens.weight": t["model.embed_tokens.weight"][:1024]}))
    edit_config(ckpt, lambda c: c.update(vocab_size=1024))
    assert llm_error(ckpt) == (
        f"{ckpt / 'tokenizer.json'}: 2003 tokens, more than the model's vocab_size=1024 (config.json)")


# -- tokenizer and chat template ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "reason"),
    [('{"version": "1.0", "model": ', "not JSON: Expecting value at line 1 column 29"),
     ('{"version": "1.0"}', 'JSON, but an object with keys version: missing the "model" section'),
     ('{"a": 1}', 'keys a: missing the "model" section'), ('[1, 2]', 'JSON, but list: missing'),
     ('{"model": {"type": "BPE"}}', "(Missing vocab/merges)"), ("", "the file is empty")],
)
def test_corrupt_tokenizer_json_names_the_file(tiny_checkpoint: str, tmp_path: Path, content: str,
                                               reason: str) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "tok")
    (ckpt / "tokenizer.json").write_text(content)
    message = llm_error(ckpt)
    assert message.startswith(f"{ckpt / 'tokenizer.json'}: not a valid tokenizer.json (") and reason in message


def test_corrupt_chat_template_names_its_file(tiny_checkpoint: str, tmp_path: Path) -> None:
    from xrt.engine.tokenizer import Tokenizer

    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "template")
    hi = [{"role": "user", "content": "Hi"}]
    assert Tokenizer(str(ckpt)).apply_chat_template(hi) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    config_file = ckpt / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = "{% for m in messages %}{{ m.content }}"
    config_file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as e:
        Tokenizer(str(ckpt)).apply_chat_template(hi)
    assert str(e.value).startswith(f"{config_file}: invalid chat template (line 1: Unexpected end of template.")
    # chat_template.jinja wins over tokenizer_config.json, and is named when broken
    (ckpt / "chat_template.jinja").write_text("{{ messages[0].content | no_such_filter }}")
    with pytest.raises(CheckpointError) as e:
        Tokenizer(str(ckpt)).apply_chat_template(hi)
    assert str(e.value).startswith(f"{ckpt / 'chat_template.jinja'}: invalid chat template (line 1: No filter named")


# -- model.path: what it names ------------------------------------------------------------------------------------


def test_model_path_problems(tiny_checkpoint: str, tmp_path: Path) -> None:
    weights = os.path.join(tiny_checkpoint, WEIGHTS)
    assert problems_of([f"model.path={weights}"])["model.path"] == (
        f"{weights} is a file, not a directory; expected an HF checkpoint directory (config.json, *.safetensors, "
        f"tokenizer.json); did you mean its directory {tiny_checkpoint}?")
    missing = tmp_path / "nope"
    assert problems_of([f"model.path={missing}"])["model.path"].startswith(
        f"{missing} does not exist (no such directory); expected an HF checkpoint directory")
    empty = copy_checkpoint(tiny_checkpoint, tmp_path / "noweights")
    os.remove(empty / WEIGHTS)
    assert llm_error(empty) == f"no model.safetensors or model.safetensors.index.json in {empty}"
    truncated = copy_checkpoint(tiny_checkpoint, tmp_path / "truncated")
    data = (truncated / WEIGHTS).read_bytes()
    (truncated / WEIGHTS).write_bytes(data[: len(data) // 2])
    assert llm_error(truncated).startswith(f"{truncated / WEIGHTS}: truncated or corrupt safetensors file (")


def test_path_alone_sets_shape_and_name_under_any_group(tiny_checkpoint: str, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tiny_checkpoint, tmp_path / "My-Tiny")
    edit_config(ckpt, lambda c: c.update(max_position_embeddings=512))
    default = xrt.load_config([f"model.path={ckpt}"]).model
    assert (default.name, default.hidden_size, default.max_model_len) == ("My-Tiny", 64, 512)
    # model=qwen3-8b differs from the checkpoint in every shape field, tie_word_embeddings included
    cfg = xrt.load_config(["model=qwen3-8b", f"model.path={ckpt}", *SMALL])
    tiny = xrt.load_config([*SMALL]).model
    shape = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "rope_theta", "tie_word_embeddings")
    assert {f: getattr(cfg.model, f) for f in shape} == {f: getattr(tiny, f) for f in shape}
    assert (cfg.model.name, cfg.model.max_position_embeddings, cfg.model.max_model_len) == ("My-Tiny", 512, 512)
    out = xrt.LLM(cfg).generate("Hello", {"max_tokens": 3, "ignore_eos": True})[0]
    assert len(out.token_ids) == 3
    assert xrt.load_config([f"model.path={ckpt}", "model.name=mine"]).model.name == "mine"
    explicit = xrt.load_config(["model=qwen3-8b", f"model.path={tiny_checkpoint}", "model.max_model_len=100"]).model
    assert (explicit.max_position_embeddings, explicit.max_model_len) == (2048, 100)
    assert xrt.load_config(["model=qwen3-8b", f"model.path={tiny_checkpoint}"]).model.max_model_len == 2048


# -- Hub ids in the local Hugging Face cache ----------------------------------------------------------------------


def test_hub_id_resolves_to_the_cached_snapshot(use_hf_cache: Path) -> None:
    cfg = xrt.load_config([f"model.path={REPO_ID}", *SMALL])
    assert (cfg.model.path, cfg.model.name, cfg.model.hidden_size) == (str(use_hf_cache), REPO_ID, 64)
    assert xrt.load_config([f"model.path={use_hf_cache}"]).model.name == REPO_ID  # the snapshot given directly
    llm = xrt.LLM(cfg)
    assert llm.engine.runner.checkpoint_dir == str(use_hf_cache)
    assert len(llm.generate("Hello", {"max_tokens": 2, "ignore_eos": True})[0].token_ids) == 2


def test_code_built_config_resolves_a_hub_id(use_hf_cache: Path) -> None:
    from xrt.models.checkpoint import resolve_checkpoint
    from xrt.models.tiny import tiny_model_args

    model = tiny_model_args()
    model.path = REPO_ID
    assert resolve_checkpoint(model) == str(use_hf_cache)
    model.path = "tiny-org/not-downloaded"
    with pytest.raises(CheckpointError, match="^model.path: tiny-org/not-downloaded is not a directory, and the "):
        resolve_checkpoint(model)


def test_hub_id_not_in_the_cache_says_how_to_download(use_hf_cache: Path) -> None:
    message = problems_of(["model.path=Qwen/Qwen3-0.6B"])["model.path"]
    cache = use_hf_cache.parents[2]
    assert message == (
        f"Qwen/Qwen3-0.6B is not a directory, and the local Hugging Face cache ({cache}) holds no complete "
        "snapshot of it; download it with `hf download Qwen/Qwen3-0.6B` (huggingface_hub < 0.34: "
        "`huggingface-cli download Qwen/Qwen3-0.6B`), then run again")


def test_hub_id_without_huggingface_hub_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # what `import huggingface_hub` meets uninstalled
    assert problems_of(["model.path=Qwen/Qwen3-0.6B"])["model.path"] == (
        "Qwen/Qwen3-0.6B is not a directory; reading it as a Hub id from the local Hugging Face cache needs "
        "huggingface_hub (pip install huggingface_hub)")


def test_transformers_defaults_are_the_schema_hf_defaults() -> None:
    transformers = pytest.importorskip("transformers")
    from xrt.config import ModelArgs
    from xrt.reflect import hf_values

    ours = hf_values(ModelArgs, {}, defaults=True)
    reference = transformers.Qwen3Config()
    theta = getattr(reference, "rope_theta", None) or reference.rope_parameters["rope_theta"]
    assert ours == {"rope_theta": theta, "rms_norm_eps": reference.rms_norm_eps,
                    "max_position_embeddings": reference.max_position_embeddings,
                    "tie_word_embeddings": reference.tie_word_embeddings}


# -- the CLI: exit 2, one line, no traceback ----------------------------------------------------------------------


def bad_checkpoints(good: str, root: Path) -> Iterator[tuple[str, list[str], str]]:
    """(case, `xrt run` overrides, text the one error line must hold)."""
    ckpt = copy_checkpoint(good, root / "int32")
    edit_tensors(ckpt, as_int32(DOWN))
    yield "int32", [f"model.path={ckpt}"], f"{ckpt / WEIGHTS}: tensor {DOWN} has dtype int32"
    ckpt = copy_checkpoint(good, root / "nan")
    edit_tensors(ckpt, set_value(DOWN, (0, 0), float("nan")))
    yield "nan", [f"model.path={ckpt}"], f"{ckpt / WEIGHTS}: tensor {DOWN} holds 1 NaN/inf value(s)"
    ckpt = copy_checkpoint(good, root / "nokeys")
    edit_config(ckpt, drop_keys("intermediate_size"))
    yield "nokeys", [f"model.path={ckpt}"], f"model.path: {ckpt / 'config.json'}: missing intermediate_size;"
    ckpt = copy_checkpoint(good, root / "tokenizer")
    (ckpt / "tokenizer.json").write_text('{"model": ')
    yield "tokenizer", [f"model.path={ckpt}"], f"{ckpt / 'tokenizer.json'}: not a valid tokenizer.json ("
    ckpt = copy_checkpoint(good, root / "template")
    (ckpt / "chat_template.jinja").write_text("{% if %}")
    yield "template", [f"model.path={ckpt}", "chat=true"], f"{ckpt / 'chat_template.jinja'}: invalid chat template"
    yield "file", [f"model.path={ckpt / WEIGHTS}"], f"model.path: {ckpt / WEIGHTS} is a file, not a directory"
    yield "missing", [f"model.path={root / 'nope'}"], f"model.path: {root / 'nope'} does not exist"
    ckpt = copy_checkpoint(good, root / "noweights")
    os.remove(ckpt / WEIGHTS)
    yield "noweights", [f"model.path={ckpt}"], f"no model.safetensors or model.safetensors.index.json in {ckpt}"
    ckpt = copy_checkpoint(good, root / "truncated")
    (ckpt / WEIGHTS).write_bytes((ckpt / WEIGHTS).read_bytes()[:100])
    yield "truncated", [f"model.path={ckpt}"], f"{ckpt / WEIGHTS}: truncated or corrupt safetensors file"
    yield "hub", ["model.path=Qwen/Qwen3-0.6B"], "download it with `hf download Qwen/Qwen3-0.6B`"
    yield "contradicts", [f"model.path={good}", "model.hidden_size=128"], "model.hidden_size: 128 does not match 64"


@pytest.fixture(scope="module")
def cli_cases(tiny_checkpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[str], str]]:
    root = tmp_path_factory.mktemp("bad_cli")
    return {case: (overrides, expected) for case, overrides, expected in bad_checkpoints(tiny_checkpoint, root)}


# In a fresh interpreter: the errors raised while composing (no torch: fast) and one raised while loading (a
# warning printed at import would break "one line" there). The rest run through the CLI's main() in this process
# (a subprocess that loads pays 3-5 s for torch); an exception main() failed to turn into its line fails them too.
SUBPROCESS_CASES = ["nokeys", "file", "missing", "hub", "nan"]
IN_PROCESS_CASES = ["int32", "tokenizer", "template", "noweights", "truncated", "contradicts"]


@pytest.fixture(scope="module")
def cli_runs(cli_cases: dict[str, tuple[list[str], str]], hf_cache: tuple[Path, Path]
             ) -> dict[str, subprocess.CompletedProcess[str]]:
    """`python -m xrt run` for SUBPROCESS_CASES, and `config show` of the Hub id (HF_HUB_CACHE read by
    huggingface_hub itself), two at a time (CI has two cores)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_CACHE": str(hf_cache[0])}
    env.pop("XRT_DEBUG", None)
    jobs = {case: ["run", *cli_cases[case][0], "prompt=hi", *SMALL] for case in SUBPROCESS_CASES}
    jobs["hub-ok"] = ["config", "show", "--json", f"model.path={REPO_ID}"]

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "xrt", *args], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(run, jobs.values()), strict=True))


def assert_one_error_line(returncode: int, stderr: str, expected: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert returncode == 2, stderr
    assert "Traceback" not in stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_every_cli_case_runs_one_way(cli_cases: dict) -> None:
    assert sorted(SUBPROCESS_CASES + IN_PROCESS_CASES) == sorted(cli_cases)


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_cli_process_refuses_with_one_line_and_exit_2(cli_runs: dict, cli_cases: dict, case: str) -> None:
    result = cli_runs[case]
    assert_one_error_line(result.returncode, result.stderr, cli_cases[case][1])


@pytest.mark.parametrize("case", IN_PROCESS_CASES)
def test_cli_main_refuses_with_one_line_and_exit_2(cli_cases: dict, case: str, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from xrt.cli.main import main

    monkeypatch.delenv("XRT_DEBUG", raising=False)  # it asks for tracebacks
    overrides, expected = cli_cases[case]
    returncode = main(["run", *overrides, "prompt=hi", *SMALL])
    assert_one_error_line(returncode, capsys.readouterr().err, expected)


def test_cli_reads_a_hub_id_from_hf_hub_cache(cli_runs: dict, hf_cache: tuple[Path, Path]) -> None:
    result = cli_runs["hub-ok"]
    assert result.returncode == 0, result.stderr
    model = json.loads(result.stdout)["model"]
    assert (model["path"], model["name"], model["hidden_size"]) == (str(hf_cache[1]), REPO_ID, 64)
