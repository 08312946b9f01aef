"""The step channel and the host-side collectives between two real processes (gloo): every message rank 0
sends arrives whole and in order, however long (one frame, or a frame and the rest), and decodes to what was
encoded; the MIN over ranks and the xrt collective ops see both ranks; an idle rank 0 keeps the channel
alive past its timeout, and a receiver left without messages times out. The wire format round trip
in-process."""

from __future__ import annotations

import datetime
import multiprocessing
import queue
import time

import attrs
import numpy as np
import pytest
import torch
import torch.distributed as dist
from tp_helpers import channel_peer

from xrt.config import Device, ParallelArgs, XrtConfig
from xrt.distributed.channel import FRAME, KeepAlive, StepChannel
from xrt.distributed.groups import close_groups, init_groups, master_store
from xrt.distributed.wire import Kind, decode_launch, decode_step, encode_launch, encode_step
from xrt.executor.step import DecodeBatch, SeqChunk, StepInput
from xrt.ops.collectives import min_over_ranks
from xrt.ops.parallel_state import TPState

PAGE = 4
TIMEOUT_S = 2.0


def steps() -> list[StepInput]:
    rng = np.random.default_rng(0)
    long_prompt = rng.integers(0, 2048, 3 * FRAME).tolist()  # longer than a frame: a second broadcast
    return [
        StepInput(False, [SeqChunk([7], 5, [3, 1])]),
        StepInput(True, [SeqChunk([1, 2, 3], 0, [0], True), SeqChunk([9] * 9, 4, [4, 5, 6], False),
                         SeqChunk([2047], 0, [8])]),
        StepInput(True, [SeqChunk(long_prompt, 16, list(range(-(-(16 + len(long_prompt)) // PAGE))))]),
        StepInput(True, [SeqChunk([5] * (n + 1), 0, list(range(n, 2 * n + 1))) for n in range(40)]),
    ]


def batches() -> list[tuple[DecodeBatch, bool]]:
    table = np.arange(8 * 6, dtype=np.int32).reshape(8, 6)
    return [
        (DecodeBatch([11, 0, 12], [-1, 1, -1], [3, 9, 0], [5, 2, 7], table), True),
        (DecodeBatch([4, 5], [-1, -1], [12, 1], range(2), [[9, 8, 7, 6], [3]]), False),
    ]


def expected_launch(batch: DecodeBatch, after: bool) -> tuple:
    width = max(batch.positions) // PAGE + 1
    rows = [list(batch.page_tables[r][:width]) for r in batch.table_rows]
    rows = [[int(p) for p in r] + [0] * (width - len(r)) for r in rows]
    return (list(batch.token_ids), list(batch.sources), list(batch.positions), list(range(len(batch))), rows, after)


def test_wire_round_trip() -> None:
    for step in steps():
        assert decode_step(encode_step(step)) == step
    for batch, after in batches():
        decoded, got_after = decode_launch(encode_launch(batch, after, PAGE))
        assert (list(decoded.token_ids), list(decoded.sources), list(decoded.positions), list(decoded.table_rows),
                decoded.page_tables.tolist(), got_after) == expected_launch(batch, after)
        assert decoded.page_tables.dtype == np.int32


def test_channel_and_collectives_between_two_processes() -> None:
    cfg = XrtConfig(device=Device.CPU, parallel=attrs.evolve(ParallelArgs(), tp=2, timeout_s=60))
    store = master_store(cfg)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    peer = ctx.Process(target=channel_peer, args=(cfg, store.port, results, TIMEOUT_S), daemon=True)
    peer.start()
    try:
        groups = init_groups(cfg, 0, 0, store)
        tp = TPState(0, 2, groups.model, groups.cpu)
        assert min_over_ranks(7, tp) == 5
        x = torch.full((2, 3), 1.0)
        torch.ops.xrt.all_reduce_(x, tp.group_name)
        assert x.tolist() == [[11.0] * 3] * 2
        gathered = torch.ops.xrt.all_gather(torch.full((2, 1), 0.0), -1, 2, tp.group_name)
        assert gathered.tolist() == [[0.0, 1.0]] * 2
        channel = StepChannel(dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S)))
        for step in steps():
            channel.send(Kind.STEP, encode_step(step))
        for batch, after in batches():
            channel.send(Kind.LAUNCH, encode_launch(batch, after, PAGE))
        keepalive = KeepAlive(channel, TIMEOUT_S / 4)
        time.sleep(1.5 * TIMEOUT_S)  # idle for longer than the timeout: the keep-alive messages hold the peer
        keepalive.stop()
        channel.send(Kind.SHUTDOWN)
        got = [results.get(timeout=30) for _ in range(3 + len(steps()) + len(batches()))]
        while (item := results.get(timeout=30))[0] == "keepalive":
            got.append(item)
        timed_out = item  # the peer's next wait, with nothing sent, ran into the timeout
        peer.join(timeout=30)
    finally:
        close_groups()
        if peer.is_alive():
            peer.kill()
    assert got[:3] == [("min", 5), ("all_reduce", [[11.0] * 3] * 2), ("all_gather", [[0.0, 1.0]] * 2)]
    assert [v for k, v in got[3:] if k == "step"] == steps()
    assert [v for k, v in got[3:] if k == "launch"] == [expected_launch(b, a) for b, a in batches()]
    assert len([k for k, _ in got if k == "keepalive"]) >= 3
    assert timed_out[0] == "timed out" and 0.8 * TIMEOUT_S < timed_out[1] < 3 * TIMEOUT_S
    assert peer.exitcode == 0
    with pytest.raises(queue.Empty):
        results.get_nowait()


def test_a_busy_master_port_is_one_error_naming_the_field() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = XrtConfig(device=Device.CPU, parallel=attrs.evolve(ParallelArgs(), tp=2, master_port=port, timeout_s=5))
        with pytest.raises(ValueError, match=rf"^parallel\.master_port: cannot listen on 127\.0\.0\.1:{port} \("):
            master_store(cfg)
    free = master_store(attrs.evolve(cfg, parallel=attrs.evolve(cfg.parallel, master_port=0)))
    assert free.port not in (0, port)
