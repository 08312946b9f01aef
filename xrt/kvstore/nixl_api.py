"""The NIXL Python API, from whichever NIXL wheel is installed and can run the backend asked for.

`nixl` (the meta package) picks nixl_cu12 or nixl_cu13 by torch's CUDA major but depends on both (two ~60 MB
wheels). The `kv` extra installs nixl-cu12 alone: on a machine without CUDA libraries its POSIX and OBJ plugins
both load, where nixl-cu13's OBJ plugin links libcuobjclient.so.1 (cuObject), found only where CUDA 13's GDS is
installed (README: KV tiers). With both single wheels installed, the first whose plugin for the backend loads
(its shared library and everything it links, `_plugin_loads`) is imported, the one matching torch's CUDA major
first. Only one can be imported per process (both register the same pybind11 types: the second import fails), so
a process keeps the first one it imported."""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

WHEELS = ("nixl", "nixl_cu12", "nixl_cu13")


class NixlUnavailable(RuntimeError):
    """No NIXL wheel is installed: the L2 tier cannot run."""


def nixl_api(backend: str | None = None) -> ModuleType:
    """The module holding `nixl_agent` and `nixl_agent_config`: the one this process imported already, else the
    first installed wheel whose `backend` plugin loads here (any, without a backend; the first installed when
    none loads it: creating the backend then says why)."""
    for name in WHEELS:
        loaded = sys.modules.get(f"{name}._api")
        if loaded is not None:
            return loaded
    installed = [n for n in _preferred() if importlib.util.find_spec(n) is not None]
    if not installed:
        raise NixlUnavailable(
            "cache.l2 needs NIXL: pip install --no-deps 'nixl-cu12==1.5.1' (POSIX and OBJ on any machine; "
            "nixl-cu13 for GDS with a CUDA 13 torch)"
        )
    pick = next((n for n in installed if backend is None or _plugin_loads(n, backend)), installed[0])
    if pick == "nixl":
        import nixl._api as api
    elif pick == "nixl_cu12":
        import nixl_cu12._api as api
    else:
        import nixl_cu13._api as api
    _quiet_logging()
    return api


def _preferred() -> list[str]:
    """The meta package first (it chooses itself), then the single wheel matching torch's CUDA major when torch
    is loaded with CUDA, else nixl_cu12 (the one whose OBJ plugin loads without CUDA libraries)."""
    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None) or ""
    singles = ["nixl_cu13", "nixl_cu12"] if cuda.startswith("13") else ["nixl_cu12", "nixl_cu13"]
    return ["nixl", *singles]


def _plugin_loads(name: str, backend: str) -> bool:
    """Whether wheel `name`'s plugin for `backend` can be loaded (dlopen resolves every library it links),
    asked without importing the wheel. True where the plugin file is not where the wheels put it (the meta
    package): creating the backend then tells."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return False
    pkg = Path(next(iter(spec.submodule_search_locations)))
    plugin = pkg.parent / f".{pkg.name}.mesonpy.libs" / "plugins" / f"libplugin_{backend}.so"
    if not plugin.is_file():
        return True
    try:
        ctypes.CDLL(str(plugin))
    except OSError:
        return False
    return True


def _quiet_logging() -> None:
    """NIXL's Python logger writes INFO lines (every agent and backend made) to stdout, where `xrt run` prints
    its generations: keep it to warnings (NIXL_LOG_LEVEL, NIXL's own variable, still wins) and on stderr."""
    logger = logging.getLogger("nixl")
    if not os.environ.get("NIXL_LOG_LEVEL"):
        logger.setLevel(logging.WARNING)
    for h in logger.handlers:
        if isinstance(h, logging.StreamHandler) and h.stream is sys.stdout:
            h.setStream(sys.stderr)
