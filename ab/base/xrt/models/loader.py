"""Reading HF checkpoints: config.json and safetensors weights, single file or sharded."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch
from safetensors import SafetensorError, safe_open

from xrt.models.errors import CheckpointError
from xrt.models.tensor_checks import check_finite, check_floating
from xrt.progress import Progress

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"


def _check_dir(path: str) -> None:
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise CheckpointError(f"checkpoint directory {path} {what}")


def _read_json(file: str) -> object:
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: invalid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{file}: not UTF-8 text ({e})") from None


def read_hf_config(path: str) -> dict:
    """The checkpoint's config.json as a dict."""
    _check_dir(path)
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise CheckpointError(f"{file} not found: an HF checkpoint directory needs config.json")
    data = _read_json(file)
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def shard_plan(path: str) -> dict[str, list[str]]:
    """Safetensors file -> tensor names to read from it; from the index when sharded, else the single file."""
    _check_dir(path)
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        data = _read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: expected a non-empty 'weight_map' object of tensor name -> shard file")
        plan: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            plan.setdefault(os.path.join(path, str(shard)), []).append(name)
        for file in plan:
            if not os.path.isfile(file):
                raise CheckpointError(f"{file} not found: listed as a shard in {index}")
        return dict(sorted(plan.items()))
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(single):
        return {single: []}
    raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")


def _open(file: str) -> safe_open:
    try:
        return safe_open(file, framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: truncated or corrupt safetensors file ({e})") from None


def file_of(path: str, name: str) -> str:
    """The file of the checkpoint at `path` that holds (or should hold) tensor `name`: its shard, or the index when
    no shard lists it, or the single file."""
    index = os.path.join(path, INDEX_FILE)
    if not os.path.isfile(index):
        return os.path.join(path, SINGLE_FILE)
    data = _read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    shard = weight_map.get(name) if isinstance(weight_map, dict) else None
    return os.path.join(path, str(shard)) if shard else index


def tensor_bytes(file: str) -> dict[str, int]:
    """Bytes of each tensor in a safetensors file, from its header (no tensor is read); {} when unreadable."""
    try:
        with open(file, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        return {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return {}


def iter_weights(
    path: str, dtype: torch.dtype, progress: bool = True, device: torch.device | str = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF tensor name, tensor) for every weight in the checkpoint at `path`, cast to dtype and moved to
    `device`. A tensor that is not floating point, or holds NaN or inf, raises CheckpointError naming its file.
    The finiteness check runs on `device` (cheap on a GPU); the model's weight loaders then copy device to device.
    progress: a bar on a terminal, else log lines (xrt.progress): tensors and bytes read of the total."""
    plan = shard_plan(path)
    handles = {file: _open(file) for file in plan}
    for file, names in plan.items():
        if not names:
            plan[file] = list(handles[file].keys())
    total = sum(len(names) for names in plan.values())
    sizes: dict[str, int] = {}
    if progress:
        for file, names in plan.items():
            in_file = tensor_bytes(file)
            sizes.update({name: in_file.get(name, 0) for name in names})
    with Progress(total, "loading weights", "tensor", total_bytes=sum(sizes.values()), show=progress) as bar:
        for file, names in plan.items():
            handle = handles.pop(file)
            present = set(handle.keys())
            for name in names:
                if name not in present:
                    raise CheckpointError(f"{file}: tensor {name} listed in {INDEX_FILE} is missing from the shard")
                try:
                    tensor = handle.get_tensor(name)
                except (SafetensorError, OSError) as e:
                    raise CheckpointError(f"{file}: truncated or corrupt safetensors file ({e})") from None
                check_floating(file, name, tensor)
                tensor = tensor.to(dtype).to(device)
                check_finite(file, name, tensor)
                yield name, tensor
                bar.update(1, sizes.get(name, 0))
            del handle
