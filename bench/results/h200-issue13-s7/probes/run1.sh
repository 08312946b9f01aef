source scripts/gpu_env.sh
export PYTHONPATH=/tmp/site:$PWD XRT_GIT_COMMIT=$1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.used --format=csv > $R/smi.txt
timeout 120 python3 .probe/copyk.py > $R/probe-copyk.log 2>&1
timeout 150 python3 -m pytest --gpu -q -rfE tests/kernels/test_copy_rows_gpu.py tests/kvstore/test_copy_gpu.py > $R/gpu-copy-tests.log 2>&1
for lp in 0 16; do
  timeout 150 python3 -m xrt bench bench.scenario=prefix model=qwen3 model.load_format=dummy executor=cudagraph "bench.prefix_lens=[8192]" bench.iters=2 cache.num_pages=8192 cache.l2.path=/tmp/l2-06-$lp cache.l1.load_programs=$lp bench.out_dir=$R/prefix-0.6b-lp$lp > $R/prefix-0.6b-lp$lp.log 2>&1
done
timeout 200 python3 -m xrt bench bench.scenario=prefix model=qwen3-8b model.load_format=dummy executor=cudagraph "bench.prefix_lens=[8192]" bench.iters=2 cache.num_pages=8192 cache.l2.path=/tmp/l2-8-0 bench.out_dir=$R/prefix-8b-lp0 > $R/prefix-8b-lp0.log 2>&1
tar czf $OUT/fi.tgz .fi
tar czf $OUT/r.tgz -C $OUT r && rm -rf $R
