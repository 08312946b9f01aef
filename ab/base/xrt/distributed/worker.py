"""The ranks other than 0: build the same `ModelRunner` as rank 0 and run every step rank 0 sends until it
says shut down. A spawned worker (`spawned_main`, the spawn target) ignores Ctrl-C (rank 0 stops it) and
exits when rank 0's process goes away; a torchrun worker (`serve_torchrun`) is one of torchrun's processes.
Either way an error ends the worker with its text left in the store for rank 0, and on stderr."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import traceback
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

import torch.distributed as dist
from tqdm import tqdm

from xrt.config import KVTiers, XrtConfig
from xrt.distributed.channel import StepChannel
from xrt.distributed.env import torchrun_env
from xrt.distributed.groups import (
    Groups,
    check_in,
    close_groups,
    init_groups,
    join_store,
    report_failure,
    take_device,
    torchrun_groups,
)
from xrt.distributed.kv_wire import decode_kv_load, decode_kv_lookup, decode_kv_store
from xrt.distributed.wire import Kind, decode_launch, decode_step
from xrt.executor.graphs.capture import CaptureStrategy
from xrt.executor.interface import PendingTokens
from xrt.executor.runner import ModelRunner
from xrt.log import get_logger, set_rank
from xrt.ops.collectives import min_over_ranks, sum_over_ranks
from xrt.ops.parallel_state import set_tp

if TYPE_CHECKING:  # the tiers (and NIXL) load only with cache.tiers set
    from xrt.kvstore.shard import KVShard

log = get_logger(__name__)


def serve(runner: ModelRunner, channel: StepChannel, shard: KVShard | None = None) -> None:
    """Run rank 0's steps in its order until SHUTDOWN. A launch with `after` reads the tokens of this rank's
    previous launch, which holds the same tokens as rank 0's (the logits are all-gathered: every rank takes
    the same argmax). With KV tiers, `shard` does the KV_* messages; a lookup, load or flush ends in the
    collective rank 0 runs for it (xrt/distributed/kv_peers.py). On SHUTDOWN the shard's L2 writer finishes
    first, so the next run finds this rank's chunks."""
    last: PendingTokens | None = None
    while True:
        kind, payload = channel.recv()
        if kind is Kind.STEP:
            runner.execute(decode_step(payload))
            last = None
        elif kind is Kind.LAUNCH:
            batch, has_after = decode_launch(payload)
            last = runner.launch_decode(batch, last if has_after else None)
        elif kind is Kind.SHUTDOWN:
            if shard is not None:
                shard.close()
            return
        elif kind is Kind.KEEPALIVE:
            continue
        elif shard is None:
            raise RuntimeError(f"{kind.name} from rank 0, but this rank has no KV tiers (cache.tiers=gpu)")
        elif kind is Kind.KV_STORE:
            shard.store(decode_kv_store(payload))
        elif kind is Kind.KV_LOOKUP:
            min_over_ranks(shard.held(decode_kv_lookup(payload)))
        elif kind is Kind.KV_LOAD:
            min_over_ranks(shard.load(*decode_kv_load(payload)))
        elif kind is Kind.KV_PREFETCH:
            shard.prefetch(decode_kv_lookup(payload))
        elif kind is Kind.KV_FLUSH:
            shard.flush()
            sum_over_ranks(shard.counters())  # also the barrier: rank 0 returns once every rank has flushed


def run_worker(cfg: XrtConfig, groups: Groups, capture: CaptureStrategy | None) -> None:
    set_tp(groups.rank, groups.size, groups.model, groups.cpu)
    runner = ModelRunner(cfg, capture)
    shard = None
    if cfg.cache.tiers is not KVTiers.GPU:
        from xrt.kvstore.shard import KVShard

        shard = KVShard(cfg, runner.kv_cache, runner.checkpoint_dir, groups.rank, groups.size)
    serve(runner, StepChannel(groups.channel), shard)


def spawned_main(cfg: XrtConfig, rank: int, port: int, capture: CaptureStrategy | None) -> None:
    """Spawn target of rank `rank`: rendezvous at rank 0's store on `port`, serve, exit 0 on shutdown."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # tqdm's default lock is a multiprocessing semaphore, which a killed worker would leave to the resource
    # tracker (a "leaked semaphore" warning at rank 0's exit); a worker's bars need only a thread lock.
    tqdm.set_lock(threading.RLock())
    set_rank(rank)
    _exit_with_parent()
    store = None
    try:
        store = join_store(cfg, port)
        # The device before checking in: a rank that cannot have its device fails while rank 0 still watches
        # the rendezvous (inside init_process_group only the timeout would end rank 0's wait).
        take_device(cfg, rank)
        check_in(store)
        groups = init_groups(cfg, rank, rank, store)
        run_worker(cfg, groups, capture)
        close_groups()
    except BaseException as e:  # noqa: BLE001  every way out of a worker is reported to rank 0
        _fail(store, rank, e)


def serve_torchrun(cfg: XrtConfig) -> int:
    """A torchrun rank other than 0 serves one runner's lifetime (one job of the command); 1 on an error."""
    env = torchrun_env()
    assert env is not None and env.rank != 0
    groups = None
    try:
        groups = torchrun_groups(cfg, env)
        run_worker(cfg, groups, None)
        return 0
    except Exception as e:  # noqa: BLE001  reported to rank 0 and on stderr
        report_failure(groups.store if groups else None, env.rank, _describe(e))
        log.error(f"error: {_describe(e)}\n{traceback.format_exc()}")
        return 1


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _fail(store: dist.Store | None, rank: int, e: BaseException) -> None:
    report_failure(store, rank, _describe(e))
    log.error(f"error: {_describe(e)}\n{traceback.format_exc()}")
    # Not sys.exit: process groups and CUDA may hold threads that would keep a failed worker alive.
    os._exit(1)


def _exit_with_parent() -> None:
    """End this worker when rank 0's process ends, however it ends (killed included): no orphans."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="xrt-tp-parent", daemon=True).start()
