import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from xrt.models.loader import CheckpointError, iter_weights, read_hf_config
from xrt.models.tiny import make_tiny_checkpoint, tiny_model_args


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "single"), tiny_model_args(), seed=1)


def write_sharded(src: str, dst: str, shards: int) -> None:
    """A copy of `src` with its weights spread over `shards` files and an index, as HF writes large models."""
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "config.json"), dst)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, os.path.join(dst, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)


@pytest.fixture(scope="module")
def sharded(single: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    dst = str(tmp_path_factory.mktemp("ckpt") / "sharded")
    write_sharded(single, dst, shards=3)
    return dst


def test_single_file_yields_every_tensor_as_stored(single: str) -> None:
    stored = load_file(os.path.join(single, "model.safetensors"))
    loaded = dict(iter_weights(single, torch.float32, progress=False))
    assert loaded.keys() == stored.keys()
    assert "model.layers.2.self_attn.q_norm.weight" in loaded
    for name, t in stored.items():
        assert torch.equal(loaded[name], t), name


def test_sharded_equals_single_file(single: str, sharded: str) -> None:
    a = dict(iter_weights(single, torch.float32, progress=False))
    b = dict(iter_weights(sharded, torch.float32, progress=False))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tensors_are_converted_to_dtype(single: str, dtype: torch.dtype) -> None:
    stored = load_file(os.path.join(single, "model.safetensors"))
    for name, t in iter_weights(single, dtype, progress=False):
        assert t.dtype == dtype
        assert torch.equal(t, stored[name].to(dtype))


def test_progress_is_a_log_line_not_a_bar_when_stderr_is_not_a_tty(
    single: str, capfd: pytest.CaptureFixture[str]
) -> None:
    n = len(list(iter_weights(single, torch.float32, progress=True)))
    err = capfd.readouterr().err
    assert "\r" not in err and f"[xrt] loading weights: {n}/{n} tensors, " in err
    list(iter_weights(single, torch.float32, progress=False))
    assert capfd.readouterr().err == ""


def test_missing_directory_names_it(tmp_path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="does not exist") as e:
        list(iter_weights(missing, torch.float32))
    assert missing in str(e.value)


def test_directory_without_safetensors_names_the_expected_file(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError) as e:
        list(iter_weights(str(tmp_path), torch.float32))
    assert "model.safetensors" in str(e.value) and str(tmp_path) in str(e.value)


def test_index_naming_a_missing_shard_names_the_shard(sharded: str, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(sharded, broken)
    os.remove(broken / "model-00002-of-00003.safetensors")
    with pytest.raises(CheckpointError, match="model-00002-of-00003.safetensors") as e:
        list(iter_weights(str(broken), torch.float32))
    assert "not found" in str(e.value) and "model.safetensors.index.json" in str(e.value)


def test_index_naming_a_tensor_missing_from_its_shard_names_the_tensor(sharded: str, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(sharded, broken)
    index_file = broken / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00003.safetensors"
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model\.layers\.9\.mlp\.up_proj\.weight") as e:
        list(iter_weights(str(broken), torch.float32))
    assert "model-00001-of-00003.safetensors" in str(e.value)


def test_invalid_index_json_names_the_index(sharded: str, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(sharded, broken)
    (broken / "model.safetensors.index.json").write_text('{"weight_map": {')
    with pytest.raises(CheckpointError, match="model.safetensors.index.json: invalid JSON"):
        list(iter_weights(str(broken), torch.float32))


@pytest.mark.parametrize("keep", [0.5, 0.01, 0.0])
def test_truncated_single_file_names_the_file(single: str, tmp_path, keep: float) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(single, broken)
    file = broken / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as e:
        list(iter_weights(str(broken), torch.float32))
    assert str(file) in str(e.value)


def test_truncated_shard_names_the_shard_before_yielding_anything(sharded: str, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(sharded, broken)
    file = broken / "model-00003-of-00003.safetensors"
    file.write_bytes(file.read_bytes()[:-7])
    weights = iter_weights(str(broken), torch.float32)
    with pytest.raises(CheckpointError, match="model-00003-of-00003.safetensors: truncated or corrupt"):
        next(weights)


def test_read_hf_config(single: str) -> None:
    cfg = read_hf_config(single)
    assert cfg["model_type"] == "qwen3" and cfg["hidden_size"] == 64


def test_read_hf_config_errors_name_the_file(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="config.json not found") as e:
        read_hf_config(str(tmp_path))
    assert str(tmp_path) in str(e.value)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: invalid JSON"):
        read_hf_config(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        read_hf_config(str(tmp_path))
    with pytest.raises(CheckpointError, match="does not exist"):
        read_hf_config(str(tmp_path / "missing"))
