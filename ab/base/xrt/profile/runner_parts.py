"""The one place the profile command reaches past the Runner interface into the executor: the parts of a
step (prepare, plan, forward, logits), the decode graphs it replays without the engine, and the host staging
of decode steps. When the executor's internals change, this module is what follows them."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from xrt.executor.graphs.decode_inputs import DecodeStaging, decode_batch, stage_decode
from xrt.executor.runner import ModelRunner
from xrt.executor.step import DecodeBatch, StepInput

PARTS = ("prepare", "plan", "forward_host", "logits_host", "step")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_prefill_parts(runner: ModelRunner, steps: list[StepInput]) -> dict[str, list[float]]:
    """Seconds per step of each part: prepare (metadata to the device), plan, the forward as the host sees it
    (no synchronize: on a GPU, the launch time of every kernel), logits, the whole step synchronized; and on
    CUDA "gpu", the forward's device time between two events."""
    device = runner.device
    t: dict[str, list[float]] = {k: [] for k in (*PARTS, "gpu")}
    cuda = device.type == "cuda"
    for step in steps:
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            ids, meta = runner.prepare(step)
            t1 = time.perf_counter()
            runner.backend.plan(meta)
            t2 = time.perf_counter()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            hidden = runner.forward_hidden(ids, meta)
            if cuda:
                end.record()
            t3 = time.perf_counter()
            logits = runner.logits(hidden, meta).float()
            t4 = time.perf_counter()
            logits.cpu()
        t5 = time.perf_counter()
        for key, v in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t0), strict=True):
            t[key].append(v)
        if cuda:
            t["gpu"].append(start.elapsed_time(end) / 1e3)
    return t


def num_layers(runner: ModelRunner) -> int:
    return len(runner.attention_layers)


def decode_replay(runner: ModelRunner, step: StepInput) -> tuple[int, Callable[[], None]] | None:
    """(bucket, replay) for a decode step staged into the CUDA-graph runner's static inputs: replay() reruns
    the captured graph on them with no host work. None when the batch is above the largest graph."""
    graphs = runner.decode_graphs
    bucket = graphs.buckets.bucket_for(len(step.seqs)) if graphs is not None else None
    if graphs is None or bucket is None:
        return None
    graph = graphs.stage(decode_batch(step), bucket).graph
    return bucket, graph.replay


class HostStaging:
    """The CUDA-graph runner's host staging of a launched decode step, without its upload and replay."""

    def __init__(self, max_batch: int, max_pages_per_seq: int, page_size: int, loop_max_rows: int) -> None:
        self.staging = DecodeStaging.zeros(max_batch, max_pages_per_seq)
        self.page_size = page_size
        self.loop_max_rows = loop_max_rows

    def stage(self, batch: DecodeBatch) -> int:
        return stage_decode(self.staging, batch, len(batch), self.page_size, self.loop_max_rows)


def stage_decode_seconds(step: StepInput, page_size: int, max_model_len: int, loop_max_rows: int, reps: int) -> float:
    """Host time of staging a decode step given as SeqChunks (the CUDA-graph runner's execute() path)."""
    n = len(step.seqs)
    staging = DecodeStaging.zeros(n, -(-(max_model_len + 1) // page_size))
    t0 = time.perf_counter()
    for _ in range(reps):
        stage_decode(staging, decode_batch(step), n, page_size, loop_max_rows)
    return (time.perf_counter() - t0) / reps


def describe(runner: ModelRunner) -> str:
    return (f"{type(runner).__name__} on {runner.device} ({str(runner.dtype).removeprefix('torch.')}), attention "
            f"backend {type(runner.backend).__name__}, {num_layers(runner)} layers, {runner.num_pages} KV pages")
