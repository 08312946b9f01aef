"""Session 28: the host time of a decode step's scheduling while the KV cache is full and the waiting prompt at the
head of the queue has a long cached prefix but does not fit the free pages (an overloaded server's multi-turn
traffic: the next turn of a conversation waits while other requests decode). Every step checks whether that prompt
fits, which needs its cached prefix (`KVCacheManager.gpu_match`). Both scheduling paths: `schedule` (synchronous
executors) and `schedule_overlapped` (executor=cudagraph). Median of 300 steps, page size 16, 9 sequences decoding.
`python bench/results/cpu-issue26-s28/full_cache_step.py` from the repository root."""
import platform
import random
import statistics
import time

from xrt.config import SamplingArgs, SchedulerArgs
from xrt.engine.scheduler import Scheduler
from xrt.engine.sequence import Sequence
from xrt.kvcache.manager import KVCacheManager

PS = 16


def seq(i: int, ids: list[int]) -> Sequence:
    return Sequence(request_id=i, prompt_token_ids=ids, sampling=SamplingArgs(max_tokens=10**6), seed=0)


def setup(n: int) -> Scheduler:
    """Decoding: a sequence of n - 8 tokens (its full pages keyed) and 8 of 60 tokens, whose next tokens open no
    page; waiting, the next turn of the first: its tokens and 72 more. 2 free pages, fewer than the 5 fresh ones
    the waiting prompt needs past its cached prefix."""
    rnd = random.Random(n)
    first = [rnd.randrange(3, 150_000) for _ in range(n - 8)]
    others = [[rnd.randrange(3, 150_000) for _ in range(60)] for _ in range(8)]
    pages = n // PS + 8 * 4 + 2
    s = Scheduler(SchedulerArgs(max_num_seqs=256, max_batched_tokens=n + 1024, chunked_prefill=True),
                  KVCacheManager(pages, PS, True), n + 4096)
    for i, ids in enumerate([first, *others]):
        s.add(seq(i, ids))
    step = s.schedule()
    s.postprocess(step)
    for r in step.sampled_seqs:
        r.token_ids.append(1)
    s.add(seq(100, first + [rnd.randrange(3, 150_000) for _ in range(72)]))
    assert s.kv.num_free_pages == 2
    return s


def steps_us(n: int, overlapped: bool) -> float:
    """One step's scheduling, the state held still between steps (no token is appended, so no page opens and the
    waiting prompt keeps not fitting); the first step left out."""
    s = setup(n)
    times = []
    for _ in range(301):
        t = time.perf_counter()
        out = s.schedule_overlapped(256) if overlapped else s.schedule()
        times.append(time.perf_counter() - t)
        assert out and len(s.waiting) == 1, "the waiting prompt was admitted or the decode did not run"
    return statistics.median(times[1:]) * 1e6


print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
print("| cached prefix tokens | schedule us | schedule_overlapped us |")
print("|--:|--:|--:|")
for n in (1024, 8192):
    print(f"| {n} | {steps_us(n, False):.0f} | {steps_us(n, True):.0f} |")
