"""Hydra's own application object over xrt's conf/, for multiruns: the sweepers and launchers (basic, joblib,
submitit, Optuna, ...) need it, where a single run needs only the compose API (`xrt.config.compose`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from xrt.config.compose import SCHEMA_NODE, conf_dir


def register_schema() -> None:
    """conf/config.yaml lists the schema's defaults first, as the structured config `xrt_schema`."""
    from hydra.core.config_store import ConfigStore

    from xrt.config import XrtConfig
    from xrt.reflect import to_dict

    ConfigStore.instance().store(name=SCHEMA_NODE, node=to_dict(XrtConfig()))


@contextmanager
def hydra_app(task_name: str) -> Iterator[Any]:
    """A `hydra._internal.hydra.Hydra` over conf/ (what `@hydra.main` builds), version base 1.3 (no change of
    working directory). Hydra is global state: an application's own Hydra is set aside and restored after."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    register_schema()
    outer = get_gh_backup() if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    version.setbase("1.3")
    try:
        yield Hydra.create_main_hydra2(task_name, create_config_search_path(f"file://{conf_dir()}"))
    finally:
        GlobalHydra.instance().clear()
        if outer is not None:
            restore_gh_from_backup(outer)


__all__ = ["hydra_app", "register_schema"]
