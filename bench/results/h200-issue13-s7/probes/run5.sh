source scripts/gpu_env.sh
export PYTHONPATH=/tmp/site:$PWD XRT_GIT_COMMIT=$1
timeout 100 python3 -m xrt bench bench.scenario=prefix model=qwen3 model.load_format=dummy executor=cudagraph "bench.prefix_lens=[8192]" bench.iters=3 cache.num_pages=8192 cache.l2.path=/tmp/l2-06 bench.out_dir=$OUT/prefix-0.6b-8k > $OUT/prefix-0.6b-8k.log 2>&1
