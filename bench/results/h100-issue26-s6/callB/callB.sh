# GPU call B (session 22), .whl and .whl-serve carried (no .fi: FlashInfer compiles on first use): the serve GPU
# test at 7d9280c (the greedy argmax in the decode graphs is on the server's path too), then where the 0.6B figures
# stand (batches 1, 8, 100) and the host's share of a prefill step (profile.mode=step), as time allows.
source scripts/gpu_env.sh || exit 1
R=/tmp/rb; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
cp ab/callB.sh $R/
s=$(date +%s)
timeout 220 python3 -m pytest -rfE --gpu -m gpu tests/serve -p no:cacheprovider > $R/serve-gpu.log 2>&1
echo "rc=$? $(( $(date +%s)-s )) s" >> $R/serve-gpu.log
tail -3 $R/serve-gpu.log
tar -czf $OUT/rb.tgz -C /tmp rb
timeout 80 python3 -m xrt bench executor=cudagraph bench.peer=none "bench.batch=[1,8,100]" bench.iters=3 bench.out_dir=$R/lat > $R/lat.log 2>&1
echo "lat rc=$?" >> $R/times.txt; tar -czf $OUT/rb.tgz -C /tmp rb
timeout 60 python3 -m xrt profile profile.mode=step executor=cudagraph "profile.batch=[1]" > $R/step.log 2>&1
echo "step rc=$?" >> $R/times.txt; tar -czf $OUT/rb.tgz -C /tmp rb
cat $R/times.txt; grep "\[bench\] cudagraph" $R/lat.log; grep -A 12 "runner prefill" $R/step.log | head -14
