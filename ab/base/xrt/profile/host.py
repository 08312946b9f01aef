"""profile.mode=host: the host cost of one decode step, without a model (runs on CPU). LLMEngine.step()
drives a stand-in runner that answers at once, so everything measured is engine and staging work that a GPU
step would have to hide. Two stand-ins: `execute` returns preset logits (the eager runner's interface; the
CUDA-graph runner's staging of such a step is timed beside it) and `launch` takes greedy decode launches and
stages them as the CUDA-graph runner does (its overlapped interface; staging is inside the step). Neither
counts the runner's torch / FlashInfer work (upload, plan, replay)."""

from __future__ import annotations

import copy
import cProfile
import io
import pstats
import random
import statistics
import time

import torch

from xrt.bench.markdown import md_table
from xrt.config import Device, SamplingArgs, XrtConfig
from xrt.engine.engine import LLMEngine
from xrt.executor.step import DecodeBatch, StepInput
from xrt.profile.runner_parts import HostStaging, stage_decode_seconds
from xrt.profile.setup import Emit, header

# Small: the argmax over these logits is device work on a GPU, not host work to measure here.
VOCAB = 1024
MAX_LAUNCH = 128
RUNNERS = ("execute", "launch")


class InstantRunner:
    """Returns the same preset logits rows every step; keeps the last decode step it was handed."""

    decode_capacity = 0

    def __init__(self, num_pages: int, page_size: int, max_model_len: int) -> None:
        self.device = torch.device("cpu")
        self.num_pages = num_pages
        self.page_size = page_size
        self.max_model_len = max_model_len
        self.vocab_size = VOCAB
        self.checkpoint_dir: str | None = None
        self.last_argmax: torch.Tensor | None = None
        self.logits = torch.randn(MAX_LAUNCH * 8, VOCAB, generator=torch.Generator().manual_seed(0))
        self.last_decode: StepInput | None = None

    def execute(self, step: StepInput) -> torch.Tensor:
        if not step.is_prefill:
            self.last_decode = step
        return self.logits[: sum(1 for c in step.seqs if c.needs_logits)]


class PresetTokens:
    def __init__(self, tokens: list[int]) -> None:
        self._tokens = tokens

    def tokens(self) -> list[int]:
        return self._tokens


class InstantLauncher(InstantRunner):
    """Also takes greedy decode launches: stages them as the CUDA-graph runner does; tokens come back preset."""

    decode_capacity = MAX_LAUNCH

    def __init__(self, num_pages: int, page_size: int, max_model_len: int, loop_max_rows: int) -> None:
        super().__init__(num_pages, page_size, max_model_len)
        self.staging = HostStaging(MAX_LAUNCH, -(-(max_model_len + 1) // page_size), page_size, loop_max_rows)
        self.preset = [PresetTokens(list(range(n))) for n in range(MAX_LAUNCH + 1)]

    def launch_decode(self, batch: DecodeBatch, after: PresetTokens | None) -> PresetTokens:
        self.staging.stage(batch)
        return self.preset[len(batch)]


def make_engine(cfg: XrtConfig, kind: str, batch: int, steps: int) -> tuple[LLMEngine, InstantRunner]:
    """An engine over a stand-in runner, past the prefill of `batch` sequences and their first decode step."""
    context, page = cfg.profile.input_len, cfg.cache.page_size
    c = copy.deepcopy(cfg)
    c.model.vocab_size, c.model.max_model_len = VOCAB, context + steps + 64
    c.cache.num_pages = batch * -(-c.model.max_model_len // page) + 16
    c.cache.prefix_caching, c.device = True, Device.CPU
    c.scheduler.max_num_seqs = max(c.scheduler.max_num_seqs, batch)
    c.scheduler.max_batched_tokens, c.scheduler.chunked_prefill = batch * context, True
    if kind == "launch":
        runner = InstantLauncher(c.cache.num_pages, page, c.model.max_model_len, c.executor.staging_loop_max_rows)
    else:
        runner = InstantRunner(c.cache.num_pages, page, c.model.max_model_len)
    engine = LLMEngine(c, runner=runner)
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


def top_functions(engine: LLMEngine, steps: int, rows: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    time_steps(engine, steps)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(rows)
    return buf.getvalue().strip()


def run_host(cfg: XrtConfig, emit: Emit) -> list[dict[str, object]]:
    """One row per (stand-in, batch): median and min host microseconds of a decode step."""
    p = cfg.profile
    emit(header("engine host cost per decode step (no model)", torch.device("cpu"), cfg))
    results, profiles = [], []
    for kind in RUNNERS:
        for batch in p.batch:
            engine, runner = make_engine(cfg, kind, batch, p.warmup + 2 * p.iters)
            time_steps(engine, p.warmup)
            times = time_steps(engine, p.iters)
            stage = None
            if kind == "execute":
                assert runner.last_decode is not None and len(runner.last_decode.seqs) == batch
                stage = stage_decode_seconds(
                    runner.last_decode, cfg.cache.page_size, engine.max_model_len,
                    cfg.executor.staging_loop_max_rows, reps=200,
                )
            results.append({"runner": kind, "batch": batch, "step_median_us": statistics.median(times) * 1e6,
                            "step_min_us": min(times) * 1e6, "stage_decode_us": stage and stage * 1e6})
            if p.rows:
                profiles.append(f"## {kind}, batch {batch}: cProfile over {p.iters} steps, by own time\n\n```\n"
                                f"{top_functions(engine, p.iters, p.rows)}\n```")
    rows = [[r["runner"], r["batch"], f"{r['step_median_us']:.1f}", f"{r['step_min_us']:.1f}",
             "(in step)" if r["stage_decode_us"] is None else f"{r['stage_decode_us']:.1f}"] for r in results]
    emit(f"\nhost microseconds per decode step: context {p.input_len}, page {cfg.cache.page_size}, "
         f"{p.iters} steps\n")
    emit("\n".join(md_table(["runner", "batch", "step median", "step min", "stage_decode"], rows,
                            [False, True, True, True, True])))
    for text in profiles:
        emit("\n" + text)
    return results
