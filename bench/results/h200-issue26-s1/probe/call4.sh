# GPU call 3 (session 15): the skinny GEMM on the 8B shapes, 8B batch-1 breakdown, the compiled HF peer at 8 / 100.
source scripts/gpu_env.sh || exit 1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $R/gpu.txt
t() { name=$1; shift; s=$(date +%s)
  timeout 300 "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; }
B8="model=qwen3-8b model.load_format=dummy"
t gemv-8b python3 -m xrt bench bench.scenario=kernels "bench.kernels=[gemv]" $B8 "bench.batch=[1,8]" bench.out_dir=$R/gemv-8b
t breakdown-8b python3 -m xrt profile profile.mode=breakdown executor=cudagraph $B8 "profile.batch=[1]"
t peer-compile-0.6b python3 -m xrt bench executor=cudagraph bench.peer=compile "bench.batch=[8,100]" bench.iters=3 bench.out_dir=$R/peer-compile-0.6b
cat $R/times.txt
cat $R/gemv-8b/results.md 2>/dev/null | head -80
grep -v "^\[xrt\]" $R/breakdown-8b.log | tail -60
grep -E "batch|TPOT" $R/peer-compile-0.6b.log | tail -6
tar -czf $OUT/r.tgz -C $OUT r && rm -rf $R
