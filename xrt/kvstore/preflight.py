"""What the KV tiers need of this machine, asked before a model loads (`xrt run`, `config validate`): host memory
for cache.l1.size_gb on every rank of this host (a pinned allocation past it fails inside torch's allocator, or
the OOM killer ends the run), and for `cache=l1_l2` a NIXL wheel,
a backend plugin NIXL can start here (GDS needs GPUDirect Storage's cuFile; NIXL itself only says so in a
traceback once the store is built), backend_params the plugin knows (NIXL takes any key and ignores the unknown
ones, so a misspelt `use_uring` would silently do nothing), and an L2 directory that can be made (a store that
cannot write is a cache that misses: a warning, not an error; the run's tier summary says it too). With OBJ, the
object store is asked for one listing: credentials or a bucket it refuses are errors naming
cache.l2.backend_params, an endpoint that does not answer is a warning (L2 would be off, requests still served)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from xrt.config import KVTiers, L2Backend, XrtConfig
from xrt.kvstore.build import l1_memory_problem, l2_root
from xrt.kvstore.nixl_api import NixlUnavailable, nixl_api
from xrt.kvstore.obj_client import OBJ_PARAMS, bucket_of, probe

Problem = tuple[str, str]


def tier_problems(cfg: XrtConfig, ranks_here: int) -> list[Problem]:
    """Why the tiers cannot start here: L1's host memory for `ranks_here` ranks, then L2 ([] with cache=gpu)."""
    if cfg.cache.tiers is KVTiers.GPU:
        return []
    problem = l1_memory_problem(cfg.cache.l1.size_gb, ranks_here)
    return ([problem] if problem else []) + l2_problems(cfg)


def l2_problems(cfg: XrtConfig) -> list[Problem]:
    """Why the L2 tier cannot start here ([] without cache.tiers=l1_l2)."""
    if cfg.cache.tiers is not KVTiers.L1_L2:
        return []
    args = cfg.cache.l2
    backend = args.backend.value
    try:
        api = nixl_api(backend)
    except NixlUnavailable as e:
        return [("cache.tiers", f"l1_l2: {e}")]
    if args.backend is L2Backend.OBJ and not bucket_of(args.backend_params):
        return [("cache.l2.backend_params", "OBJ needs a bucket: +cache.l2.backend_params.bucket=NAME (or "
                                            "AWS_DEFAULT_BUCKET)")]
    agent = api.nixl_agent(f"xrt-probe-{os.getpid()}", api.nixl_agent_config(backends=[]))
    plugins = list(agent.get_plugin_list())
    if backend not in plugins:
        return [("cache.l2.backend", f"{backend}: this NIXL has no such plugin (it has {', '.join(plugins)})")]
    try:
        with _native_stderr_quiet():  # NIXL's C++ logger writes its own line for the same failure
            agent.create_backend(backend, dict(args.backend_params))
    except Exception as e:  # NIXL raises its own binding errors (nixlNotFoundError, ...)
        need = " (GPUDirect Storage: cuFile and a supported filesystem)" if backend.startswith("GDS") else ""
        if backend == "OBJ":
            need = " (nixl-cu13's OBJ plugin needs libcuobjclient.so.1; nixl-cu12's needs no CUDA library)"
        return [("cache.l2.backend", f"{backend}: NIXL cannot start this backend here{need}: {e or type(e).__name__}; "
                                     f"use POSIX")]
    known = set(agent.get_plugin_params(backend)) | (OBJ_PARAMS if backend == "OBJ" else set())
    unknown = sorted(set(args.backend_params) - known)
    if unknown:
        return [("cache.l2.backend_params", f"{', '.join(unknown)}: not a parameter of NIXL's {backend} backend "
                                            f"(it takes {', '.join(sorted(known)) or 'none'})")]
    if backend == "OBJ":
        found = probe(args.backend_params, l2_root(cfg))
        if found is not None and found[0] == "problem":
            return [("cache.l2.backend_params", found[1])]
    return []


def l2_path_warning(cfg: XrtConfig) -> str | None:
    """Why the L2 directory cannot be made, or None: the run goes on with L2 storing nothing."""
    if cfg.cache.tiers is not KVTiers.L1_L2:
        return None
    if cfg.cache.l2.backend is L2Backend.OBJ:
        found = probe(cfg.cache.l2.backend_params, l2_root(cfg))
        if found is not None and found[0] == "unreachable":
            return f"cache.l2.backend_params: {found[1]}; the L2 tier would store nothing"
        return None
    root = l2_root(cfg)
    if os.path.exists(root) and not os.path.isdir(root):
        return f"cache.l2.path: {root} is a file, not a directory; the L2 tier would store nothing"
    missing = root
    while missing and not os.path.exists(missing):
        missing = os.path.dirname(missing)
    try:
        os.makedirs(root, exist_ok=True)
        writable = os.access(root, os.W_OK | os.X_OK)
    except OSError as e:
        return f"cache.l2.path: cannot create {root}: {e.strerror or e}; the L2 tier would store nothing"
    finally:
        _remove_made(root, missing)
    if not writable:
        return f"cache.l2.path: cannot write in {root} (permission denied); the L2 tier would store nothing"
    return None


def _remove_made(root: str, existing: str) -> None:
    """Removes the empty directories makedirs made below `existing` (a check leaves nothing behind)."""
    path = root
    while path and os.path.abspath(path) != os.path.abspath(existing or "/"):
        with contextlib.suppress(OSError):
            os.rmdir(path)
        path = os.path.dirname(path)


@contextlib.contextmanager
def _native_stderr_quiet() -> Iterator[None]:
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


__all__ = ["l2_path_warning", "l2_problems", "tier_problems"]
