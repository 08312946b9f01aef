source scripts/gpu_env.sh
export PYTHONPATH=/tmp/site:$PWD XRT_GIT_COMMIT=$1
R=$OUT/r; mkdir -p $R
timeout 200 python3 .probe/ttft.py qwen3 > $R/probe-ttft-0.6b.log 2>&1
for sp in 16 0; do
  timeout 220 python3 -m xrt bench bench.scenario=multiturn model=qwen3-8b model.load_format=dummy executor=cudagraph bench.clients=16 bench.rounds=6 bench.turn_len=1024 bench.output_len=16 cache.num_pages=2048 cache.l1.size_gb=24 cache.l2.path=/tmp/l2m-$sp cache.l1.store_programs=$sp bench.out_dir=$R/multiturn-8b-sp$sp > $R/multiturn-8b-sp$sp.log 2>&1
done
tar czf $OUT/r.tgz -C $OUT r && rm -rf $R
