"""Host cost of one decode step, on CPU, without a model: LLMEngine.step() against a stand-in runner
that returns preset results at once, so everything measured is engine + staging work that a GPU step
would have to hide. Two stand-ins: `execute` returns preset logits (the eager runner's interface; the
CUDA-graph runner's own staging, stage_decode, is timed beside it on the steps the engine builds) and
`launch` takes greedy decode launches staged by the engine (the CUDA-graph runner's overlapped
interface; its staging is inside the step). Neither counts the runner's torch/FlashInfer work
(upload, plan, replay). A profiling tool, not a test. Usage:
    PYTHONPATH=. python scripts/host_overhead.py [--batch 1 8 100] [--context 1024] [--steps 200] [--profile 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import time

import numpy as np
import torch

from xrt.config import CacheArgs, Device, ModelArgs, SamplingArgs, SchedulerArgs, XrtConfig
from xrt.engine.engine import LLMEngine
from xrt.executor.cudagraph import stage_decode
from xrt.executor.prepare import DecodeStaging, stage_decode_rows
from xrt.executor.step import DecodeBatch, StepInput

PAGE_SIZE = 16
# Small: the argmax over these logits is device work on a GPU, not host work to measure here.
VOCAB = 1024


class InstantRunner:
    """Returns the same preset logits rows every step; records the decode steps it was handed."""

    def __init__(self, num_pages: int, max_model_len: int) -> None:
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.num_pages = num_pages
        self.page_size = PAGE_SIZE
        self.max_model_len = max_model_len
        self.vocab_size = VOCAB
        self.checkpoint_dir: str | None = None
        self.logits = torch.randn(1024, VOCAB, generator=torch.Generator().manual_seed(0))
        self.last_decode: StepInput | None = None

    def execute(self, step: StepInput) -> torch.Tensor:
        if not step.is_prefill:
            self.last_decode = step
        rows = sum(1 for c in step.seqs if c.needs_logits)
        return self.logits[:rows]


class PresetTokens:
    def __init__(self, tokens: list[int]) -> None:
        self._tokens = tokens

    def tokens(self) -> list[int]:
        return self._tokens


class InstantLauncher(InstantRunner):
    """Also takes greedy decode launches (the CUDA-graph runner's interface): the engine stages
    them into numpy arrays; the tokens come back preset."""

    def __init__(self, num_pages: int, max_model_len: int) -> None:
        super().__init__(num_pages, max_model_len)
        self.decode_capacity = 128
        self.staging = DecodeStaging.zeros(128, -(-(max_model_len + 1) // PAGE_SIZE))
        self.preset = [PresetTokens(list(range(n))) for n in range(129)]

    def launch_decode(self, batch: DecodeBatch, after: PresetTokens | None) -> PresetTokens:
        # The CUDA-graph runner's host staging, without its upload and replay.
        stage_decode_rows(
            self.staging, PAGE_SIZE, batch.token_ids, batch.sources, batch.positions, batch.page_tables,
            batch.table_rows,
        )
        return self.preset[len(batch)]


def make_engine(batch: int, context: int, steps: int, mode: str) -> tuple[LLMEngine, InstantRunner]:
    max_model_len = context + steps + 64
    pages = batch * -(-max_model_len // PAGE_SIZE) + 16
    runner = (InstantLauncher if mode == "launch" else InstantRunner)(pages, max_model_len)
    cfg = XrtConfig(
        model=ModelArgs(vocab_size=VOCAB, max_model_len=max_model_len),
        cache=CacheArgs(page_size=PAGE_SIZE, num_pages=pages, prefix_caching=True),
        scheduler=SchedulerArgs(max_num_seqs=256, max_batched_tokens=batch * context, chunked_prefill=True),
        device=Device.CPU,
    )
    engine = LLMEngine(cfg, runner=runner)
    rng = random.Random(batch)
    sampling = SamplingArgs(max_tokens=steps + 32, ignore_eos=True)
    for _ in range(batch):
        engine.add_request([rng.randrange(VOCAB) for _ in range(context)], sampling)
    while any(s.in_prefill for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    engine.step()  # the first decode step
    return engine, runner


def time_steps(engine: LLMEngine, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        out.append(time.perf_counter() - t0)
    return out


def time_stage_decode(step: StepInput, max_model_len: int, reps: int) -> float:
    n = len(step.seqs)
    max_pages = -(-(max_model_len + 1) // PAGE_SIZE)
    tokens = np.zeros((3, n), dtype=np.int64)
    indptr = np.zeros(n + 1, dtype=np.int32)
    last = np.zeros(n, dtype=np.int32)
    indices = np.zeros(n * max_pages, dtype=np.int32)
    t0 = time.perf_counter()
    for _ in range(reps):
        stage_decode(step, n, PAGE_SIZE, max_pages, tokens, indptr, last, indices)
    return (time.perf_counter() - t0) / reps


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 100])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--profile", type=int, default=25, help="rows of the cProfile table per batch (0: none)")
    ap.add_argument("--mode", choices=["execute", "launch"], nargs="+", default=["execute", "launch"])
    args = ap.parse_args()
    print(f"host microseconds per decode step (context {args.context}, page {PAGE_SIZE}, {args.steps} steps)")
    print(f"{'runner':>8} {'batch':>5} {'step med':>8} {'step min':>8} {'stage_decode':>12}")
    profiles = []
    for mode, batch in [(m, b) for m in args.mode for b in args.batch]:
        engine, runner = make_engine(batch, args.context, 2 * args.steps, mode)
        times = time_steps(engine, args.steps)
        stage = "(in step)"
        if mode == "execute":
            assert runner.last_decode is not None and len(runner.last_decode.seqs) == batch
            stage = us(time_stage_decode(runner.last_decode, engine.max_model_len, 200))
        print(f"{mode:>8} {batch:>5} {us(statistics.median(times))} {us(min(times))} {stage:>12}")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            time_steps(engine, args.steps)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.profile)
            title = f"== {mode} batch {batch}: cProfile over {args.steps} steps, by own time =="
            profiles.append(f"{title}\n{buf.getvalue()}")
    for p in profiles:
        print(p)


if __name__ == "__main__":
    main()
