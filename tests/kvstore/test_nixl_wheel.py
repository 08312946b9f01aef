"""Which NIXL wheel xrt imports for a backend (xrt/kvstore/nixl_api.py): a wheel's plugin counts as loadable
exactly when `ldd` finds every library it links, and the wheel picked for OBJ can start an OBJ backend."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from xrt.kvstore.nixl_api import _plugin_loads, nixl_api

WHEELS = [n for n in ("nixl_cu12", "nixl_cu13") if importlib.util.find_spec(n) is not None]


def _ldd_complete(name: str, backend: str) -> bool:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations
    pkg = Path(next(iter(spec.submodule_search_locations)))
    plugin = pkg.parent / f".{pkg.name}.mesonpy.libs" / "plugins" / f"libplugin_{backend}.so"
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=True).stdout
    return "not found" not in out


@pytest.mark.skipif(not WHEELS or shutil.which("ldd") is None, reason="no single NIXL wheel, or no ldd")
@pytest.mark.parametrize("backend", ["POSIX", "OBJ", "GDS"])
def test_a_plugin_loads_where_ldd_finds_its_libraries(backend: str) -> None:
    for name in WHEELS:
        assert _plugin_loads(name, backend) == _ldd_complete(name, backend), name


@pytest.mark.skipif(not WHEELS, reason="no single NIXL wheel")
def test_the_wheel_picked_for_obj_starts_an_obj_backend() -> None:
    if not any(_plugin_loads(n, "OBJ") for n in WHEELS):
        pytest.skip("no installed wheel's OBJ plugin loads here (nixl-cu13 without libcuobjclient)")
    api = nixl_api("OBJ")
    agent = api.nixl_agent("xrt-wheel-probe", api.nixl_agent_config(backends=[]))
    # no request is made: the plugin only needs a bucket name to start
    agent.create_backend("OBJ", {"bucket": "xrt-probe", "endpoint_override": "127.0.0.1:9", "scheme": "http",
                                 "access_key": "x", "secret_key": "y"})
