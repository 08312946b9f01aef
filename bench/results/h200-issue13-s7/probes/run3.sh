source scripts/gpu_env.sh
export PYTHONPATH=/tmp/site:$PWD XRT_GIT_COMMIT=$1
R=$OUT/r; mkdir -p $R
timeout 120 python3 .probe/ttft.py qwen3 > $R/probe-ttft-0.6b.log 2>&1
timeout 110 python3 -m xrt bench bench.scenario=prefix model=qwen3 model.load_format=dummy executor=cudagraph "bench.prefix_lens=[32768]" bench.iters=1 cache.num_pages=4096 cache.l2.path=/tmp/l2-06-32 bench.out_dir=$R/prefix-0.6b-32k > $R/prefix-0.6b-32k.log 2>&1
timeout 150 python3 -m xrt bench bench.scenario=prefix model=qwen3-8b model.load_format=dummy executor=cudagraph "bench.prefix_lens=[32768]" bench.iters=1 cache.num_pages=4096 cache.l2.path=/tmp/l2-8-32 bench.out_dir=$R/prefix-8b-32k > $R/prefix-8b-32k.log 2>&1
tar czf $OUT/r.tgz -C $OUT r
timeout 170 python3 -m pytest --gpu -q -rfE -p no:cacheprovider tests/kvstore tests/kernels/test_copy_rows_gpu.py tests/executor > $R/gpu-tests.log 2>&1
tar czf $OUT/r.tgz -C $OUT r && rm -rf $R
