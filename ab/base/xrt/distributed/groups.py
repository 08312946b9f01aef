"""Rendezvous and the process groups of a tensor-parallel run.

Spawned ranks meet at a TCP store rank 0 serves (`master_store`: port 0 lets the OS pick a free one, so two
runs on one host never collide); under torchrun the ranks meet through env:// (MASTER_ADDR/MASTER_PORT). Every
rank then has three groups: the model's (the default group: NCCL on CUDA, gloo on CPU), a gloo group for
host-side collectives (the model's when it is gloo), and a gloo group of its own for the step channel, so
rank 0's keep-alive messages never interleave with a collective of the model. Every group and the store
wait at most `parallel.timeout_s`. Failures are reported through the store (`report_failure`), which every
rank reaches in both launch modes."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from xrt.config import ParallelBackend, XrtConfig
from xrt.distributed.env import TorchrunEnv
from xrt.executor.device import resolve_device

JOINED_KEY = "xrt/joined"
FAILED_KEY = "xrt/failed/{rank}"


@dataclass(frozen=True)
class Groups:
    rank: int
    size: int
    backend: str
    store: dist.Store
    model: dist.ProcessGroup
    cpu: dist.ProcessGroup
    channel: dist.ProcessGroup


def timeout_of(cfg: XrtConfig) -> datetime.timedelta:
    return datetime.timedelta(seconds=cfg.parallel.timeout_s)


def backend_for(cfg: XrtConfig) -> str:
    """auto: nccl when the run is on CUDA, else gloo."""
    backend = cfg.parallel.backend
    if backend is ParallelBackend.AUTO:
        return "nccl" if resolve_device(cfg).type == "cuda" else "gloo"
    return backend.value


def master_store(cfg: XrtConfig) -> dist.TCPStore:
    """Rank 0's store for spawned ranks, listening on parallel.master_addr:master_port (0: a free port)."""
    p = cfg.parallel
    try:
        return dist.TCPStore(p.master_addr, p.master_port, cfg.parallel.tp, is_master=True,
                             timeout=timeout_of(cfg), wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"parallel.master_port: cannot listen on {p.master_addr}:{p.master_port} ({first})") from None


def join_store(cfg: XrtConfig, port: int) -> dist.TCPStore:
    """A spawned rank's client of rank 0's store (where it reports a failure from now on)."""
    return dist.TCPStore(cfg.parallel.master_addr, port, cfg.parallel.tp, is_master=False, timeout=timeout_of(cfg))


def check_in(store: dist.Store) -> None:
    """Count this spawned rank in: rank 0 waits for all before it joins the process group."""
    store.add(JOINED_KEY, 1)


def joined(store: dist.Store) -> int:
    """How many spawned ranks reached the store."""
    return store.add(JOINED_KEY, 0)


def take_device(cfg: XrtConfig, local_rank: int) -> None:
    """On CUDA, rank `local_rank` of a host uses device `local_rank` (the runner resolves the current device)."""
    if resolve_device(cfg).type == "cuda":
        torch.cuda.set_device(local_rank)


def init_groups(cfg: XrtConfig, rank: int, local_rank: int, store: dist.Store | None) -> Groups:
    """The default group over the given store (spawned ranks) or env:// (store None: torchrun), then the
    host-side and channel groups. On CUDA each rank takes device `local_rank` first."""
    size, timeout = cfg.parallel.tp, timeout_of(cfg)
    take_device(cfg, local_rank)
    backend = backend_for(cfg)
    if store is None:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size, timeout=timeout)
        store = dist.distributed_c10d._get_default_store()
    else:
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    model = dist.group.WORLD
    assert model is not None
    cpu = model if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    channel = dist.new_group(backend="gloo", timeout=timeout)
    return Groups(rank, size, backend, store, model, cpu, channel)


_TORCHRUN: Groups | None = None


def torchrun_groups(cfg: XrtConfig, env: TorchrunEnv) -> Groups:
    """Under torchrun the groups live as long as the process: every runner of a sweep reuses them."""
    global _TORCHRUN
    if _TORCHRUN is None:
        _TORCHRUN = init_groups(cfg, env.rank, env.local_rank, None)
    return _TORCHRUN


def close_groups() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def report_failure(store: dist.Store | None, rank: int, text: str) -> None:
    """Leave this rank's error where rank 0 looks for it (best effort: the store may be gone)."""
    if store is None:
        return
    try:
        store.set(FAILED_KEY.format(rank=rank), text)
    except Exception:  # noqa: BLE001  the rank is failing anyway; its stderr still has the error
        pass


def reported_failure(store: dist.Store, rank: int) -> str | None:
    key = FAILED_KEY.format(rank=rank)
    try:
        return store.get(key).decode() if store.check([key]) else None
    except Exception:  # noqa: BLE001  a store that went away has nothing to tell
        return None
