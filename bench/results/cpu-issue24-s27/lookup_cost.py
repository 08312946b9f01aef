"""Session 27: what one prefix lookup of a waiting prompt costs the host when its whole prefix is cached on the GPU
(`KVCacheManager.lookup`: blake2b over each page's token ids, chained, and a compare of the page's ids). Until
this session the overlapped engine looked an admitted prompt up twice on the way to its first token: once in
`Scheduler.schedule_overlapped`, then again in the prefill's `schedule`. Median of 200 lookups, page size 16, no
tiers. `python bench/results/cpu-issue24-s27/lookup_cost.py` from the repository root."""
import platform
import random
import statistics
import time

from xrt.kvcache.manager import KVCacheManager

PAGE = 16
rnd = random.Random(0)
print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
print("| prompt tokens | cached tokens found | lookup us (median of 200) |")
print("|--:|--:|--:|")
for n in (1024, 8192, 32768):
    kv = KVCacheManager(n // PAGE + 16, PAGE, prefix_caching=True)
    ids = [rnd.randrange(100, 150_000) for _ in range(n)]
    pages = kv.pool.take_many(n // PAGE)
    kv.pool.register(pages, [], ids, n // PAGE)  # as `commit` keys a computed prompt's full pages
    times = []
    for _ in range(200):
        t = time.perf_counter()
        hit = kv.lookup(ids)
        times.append(time.perf_counter() - t)
    print(f"| {n} | {hit.num_tokens} | {statistics.median(times) * 1e6:.0f} |")
