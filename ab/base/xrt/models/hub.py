"""What `model.path` names: a local checkpoint directory, or a Hugging Face Hub id (`Qwen/Qwen3-0.6B`) already in
the local Hugging Face cache. xrt never downloads: a Hub id that is not cached is an error saying how to download
it. Torch-free, so config composition resolves the path without importing torch."""

from __future__ import annotations

import os
import re

from xrt.models.errors import CheckpointError

# org/name as the Hub spells repo ids; anything else that does not exist is a missing path.
HUB_ID = re.compile(r"[A-Za-z0-9_][\w.-]*/[A-Za-z0-9_][\w.-]*")
EXPECTED = "an HF checkpoint directory (config.json, *.safetensors, tokenizer.json)"
# A Hub cache snapshot: .../models--<org>--<name>/snapshots/<revision>
SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+/?$")


def looks_like_hub_id(path: str) -> bool:
    return HUB_ID.fullmatch(path) is not None and ".." not in path and "--" not in path


def checkpoint_dir(path: str) -> str:
    """The checkpoint directory `path` names: itself when it is a directory, else the cached snapshot of the Hub
    id it spells. Raises CheckpointError (a message without the field name) otherwise."""
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded):
        return expanded
    if os.path.exists(expanded):
        parent = os.path.dirname(os.path.abspath(expanded))
        inside = os.path.isfile(os.path.join(parent, "config.json"))
        hint = f"; did you mean its directory {parent}?" if inside else ""
        raise CheckpointError(f"{path} is a file, not a directory; expected {EXPECTED}{hint}")
    if looks_like_hub_id(path):
        return _cached_snapshot(path)
    raise CheckpointError(
        f"{path} does not exist (no such directory); expected {EXPECTED}, or a Hub id such as Qwen/Qwen3-0.6B "
        "in the local Hugging Face cache"
    )


def checkpoint_name(path: str, directory: str) -> str:
    """A name for the checkpoint: the Hub id it was given as, or whose cache snapshot `directory` is, else the
    directory's own name (`/ckpt/Qwen3-8B` -> Qwen3-8B)."""
    if looks_like_hub_id(path) and not os.path.exists(os.path.expanduser(path)):
        return path
    normalized = os.path.abspath(directory).replace(os.sep, "/")
    snapshot = SNAPSHOT.search(normalized)
    if snapshot:
        return f"{snapshot['org']}/{snapshot['name']}"
    return os.path.basename(normalized.rstrip("/")) or normalized


def _cached_snapshot(repo_id: str) -> str:
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise CheckpointError(
            f"{repo_id} is not a directory; reading it as a Hub id from the local Hugging Face cache needs "
            "huggingface_hub (pip install huggingface_hub)"
        ) from None
    cache = constants.HF_HUB_CACHE
    try:
        # local_files_only: never touch the network; a partial snapshot whose file listing is cached is refused.
        return str(snapshot_download(repo_id, local_files_only=True))
    except ValueError as e:  # HFValidationError: not a valid repo id after all
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{repo_id} does not exist and is not a valid Hub id ({reason})") from None
    except OSError:  # LocalEntryNotFoundError (and IncompleteSnapshotError): not cached, or not completely
        raise CheckpointError(
            f"{repo_id} is not a directory, and the local Hugging Face cache ({cache}) holds no complete snapshot "
            f"of it; download it with `hf download {repo_id}` (huggingface_hub < 0.34: "
            f"`huggingface-cli download {repo_id}`), then run again"
        ) from None
