"""What a result line records about where it was measured: device, versions, commit, config."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from xrt.config import XrtConfig
from xrt.reflect.dump import to_dict

REPO_ROOT = Path(__file__).resolve().parents[2]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def git_commit() -> str:
    """HEAD of the source tree, '+dirty' when it has changes; XRT_GIT_COMMIT wins (a copied tree
    without .git, as on a lent GPU machine)."""
    if os.environ.get("XRT_GIT_COMMIT"):
        return os.environ["XRT_GIT_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def config_dict(cfg: XrtConfig) -> dict[str, Any]:
    return to_dict(cfg)


def environment(device: torch.device) -> dict[str, Any]:
    return {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "git_commit": git_commit(),
    }


def adjusted(given: dict[str, Any], used: dict[str, Any]) -> dict[str, Any]:
    """Dotted fields the bench changed in its copy of the config, with the values it ran with."""
    out: dict[str, Any] = {}
    for k, v in used.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in adjusted(given.get(k, {}), v).items()})
        elif given.get(k) != v:
            out[k] = v
    return out
