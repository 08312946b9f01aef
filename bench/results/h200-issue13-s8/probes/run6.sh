source scripts/gpu_env.sh
export PYTHONPATH=/tmp/site:$PWD XRT_GIT_COMMIT=$1
M="model=qwen3-8b model.load_format=dummy executor=cudagraph bench.clients=16 bench.rounds=6 bench.turn_len=1024 bench.output_len=16 cache.num_pages=2048 cache.l1.size_gb=24 cache.l2.path=/tmp/l2m"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/smi.txt 2>&1
timeout 480 python3 .probe/mtrace.py $OUT/mt gpu,l1,l1_l2 $M > $OUT/mtrace.log 2>&1
echo rc=$? >> $OUT/mtrace.log
cd $OUT && tar czf mt.tgz mt && rm -rf mt
