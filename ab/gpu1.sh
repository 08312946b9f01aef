#!/bin/bash
# latency A/B (alternating, twice) and prefix 8k on 8B; results under $OUT/r
source scripts/gpu_env.sh || exit 1
C=$XRT_GIT_COMMIT; R=$OUT/r; mkdir -p $R
L="executor=cudagraph bench.peer=none bench.batch=[1,8,100] bench.iters=3"
new() { XRT_GIT_COMMIT=$C timeout 170 python3 -m xrt bench $L bench.out_dir=$R/latency-$C-$1 > $R/latency-$C-$1.log 2>&1; echo "new $1 rc=$? $(date +%T)"; }
base() { (cd ab/base && XRT_GIT_COMMIT=ee2d394 PYTHONPATH=/tmp/site:$PWD timeout 170 python3 -m xrt bench $L bench.out_dir=$R/latency-ee2d394-$1 > $R/latency-ee2d394-$1.log 2>&1; echo "base $1 rc=$? $(date +%T)"); }
new 1; base 1; new 2; base 2
for f in $R/latency-*/results.md; do echo "== $f"; grep -E "^\| (cudagraph|[0-9])" $f | head -4; done
XRT_GIT_COMMIT=$C timeout 200 python3 -m xrt bench bench.scenario=prefix model=qwen3-8b model.load_format=dummy executor=cudagraph "bench.prefix_lens=[8192]" bench.iters=2 cache.num_pages=8192 cache.l2.path=/tmp/l2-8 bench.out_dir=$R/prefix-8b-8k-$C > $R/prefix-8b-8k-$C.log 2>&1; echo "prefix rc=$?"
tail -4 $R/prefix-8b-8k-$C.log
