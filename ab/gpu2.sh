#!/bin/bash
# the whole GPU suite, then the multiturn 8B A/B; results under $OUT/r
source scripts/gpu_env.sh || exit 1
C=$XRT_GIT_COMMIT; R=/tmp/r2; mkdir -p $R
[ -d /root/out/r ] && cp -r /root/out/r /tmp/r1 && echo "kept the previous call's results"; ls /root/out /tmp/r1 2>&1 | head
M="bench.scenario=multiturn model=qwen3-8b model.load_format=dummy executor=cudagraph bench.clients=16 bench.rounds=6 bench.turn_len=1024 bench.output_len=16 cache.num_pages=2048 cache.l1.size_gb=24"
XRT_GIT_COMMIT=$C timeout 200 python3 -m xrt bench $M cache.l2.path=/tmp/l2m-new bench.out_dir=$R/multiturn-8b-$C > $R/multiturn-8b-$C.log 2>&1; echo "mt new rc=$? $(date +%T)"
(cd ab/base && XRT_GIT_COMMIT=ee2d394 PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m xrt bench $M cache.l2.path=/tmp/l2m-base bench.out_dir=$R/multiturn-8b-ee2d394 > $R/multiturn-8b-ee2d394.log 2>&1; echo "mt base rc=$? $(date +%T)")
grep -h "requests/s" $R/multiturn-8b-*.log
timeout 330 python3 -m pytest --gpu -m gpu tests -q -x -p no:cacheprovider > $R/gpu-tests-$C.log 2>&1; echo "tests rc=$? $(date +%T)"; tail -6 $R/gpu-tests-$C.log
tar -czf $OUT/results.tgz -C /tmp r2 $( [ -d /tmp/r1 ] && echo r1 ) && ls -la $OUT
