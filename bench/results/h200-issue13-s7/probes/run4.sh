source scripts/gpu_env.sh
export PYTHONPATH=/tmp/site:$PWD XRT_GIT_COMMIT=$1
R=$OUT/r; mkdir -p $R
timeout 80 python3 -m xrt bench bench.scenario=prefix model=qwen3 model.load_format=dummy executor=cudagraph "bench.prefix_lens=[8192]" bench.iters=3 cache.num_pages=8192 cache.l2.path=/tmp/l2-06 bench.out_dir=$R/prefix-0.6b-8k > $R/prefix-0.6b-8k.log 2>&1
timeout 130 python3 -m xrt bench bench.scenario=prefix model=qwen3-8b model.load_format=dummy executor=cudagraph "bench.prefix_lens=[8192]" bench.iters=2 cache.num_pages=8192 cache.l2.path=/tmp/l2-8 bench.out_dir=$R/prefix-8b-8k > $R/prefix-8b-8k.log 2>&1
tar czf $OUT/r.tgz -C $OUT r
timeout 200 python3 -m pytest --gpu -q -rfE -p no:cacheprovider tests/kvstore tests/kernels/test_copy_rows_gpu.py > $R/gpu-tests-kvstore.log 2>&1
tar czf $OUT/r.tgz -C $OUT r && rm -rf $R
