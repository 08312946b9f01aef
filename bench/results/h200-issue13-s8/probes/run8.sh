source scripts/gpu_env.sh
export PYTHONPATH=/tmp/site:$PWD XRT_GIT_COMMIT=$1
M="model=qwen3-8b model.load_format=dummy executor=cudagraph bench.clients=16 bench.rounds=6 bench.turn_len=1024 bench.output_len=16 cache.num_pages=2048 cache.l1.size_gb=24 cache.l2.path=/tmp/l2m"
timeout 200 python3 -m xrt bench bench.scenario=multiturn $M bench.out_dir=$OUT/multiturn-8b > $OUT/multiturn-8b.log 2>&1
timeout 100 python3 .probe/mtrace.py $OUT/mt l1_l2 $M > $OUT/mtrace.log 2>&1
timeout 130 python3 -m xrt bench bench.scenario=prefix model=qwen3-8b model.load_format=dummy executor=cudagraph "bench.prefix_lens=[8192]" bench.iters=2 cache.num_pages=8192 cache.l2.path=/tmp/l2-8 bench.out_dir=$OUT/prefix-8b-8k > $OUT/prefix-8b-8k.log 2>&1
timeout 90 python3 -m xrt bench bench.scenario=prefix model=qwen3 model.load_format=dummy executor=cudagraph "bench.prefix_lens=[8192]" bench.iters=3 cache.num_pages=8192 cache.l2.path=/tmp/l2-06 bench.out_dir=$OUT/prefix-0.6b-8k > $OUT/prefix-0.6b-8k.log 2>&1
cd $OUT && tar czf r.tgz mt multiturn-8b prefix-8b-8k prefix-0.6b-8k && rm -rf mt multiturn-8b prefix-8b-8k prefix-0.6b-8k
cd -
timeout 150 python3 -m pytest --gpu -m gpu tests/kvstore tests/executor tests/e2e -q -p no:cacheprovider > $OUT/gpu-tests.log 2>&1; echo rc=$? >> $OUT/gpu-tests.log
