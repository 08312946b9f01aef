# GPU call B (session 16): the fused gate_up + activation (executor.fuse_activation) A/B on 0.6B and 8B; its GPU
# tests; serve.http_spin_ms A/B (issue 24). Logs into /tmp/r, one tarball back.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $R/gpu.txt
ROOT=$PWD
t() { name=$1; lim=$2; shift 2; s=$(date +%s)
  PYTHONPATH=/tmp/site:$ROOT timeout $lim "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
t tests-gemv 100 python3 -m pytest --gpu -q -p no:cacheprovider tests/kernels/test_gemv_gpu.py -k "gated or linear_op or linear_silu"
L6="executor=cudagraph bench.peer=none bench.batch=[1,8,100] bench.iters=3"
t lat-06b-off 120 python3 -m xrt bench $L6 executor.fuse_activation=false bench.out_dir=$R/lat-06b-off
t lat-06b-on 120 python3 -m xrt bench $L6 executor.fuse_activation=true bench.out_dir=$R/lat-06b-on
L8="executor=cudagraph model=qwen3-8b model.load_format=dummy bench.peer=none bench.batch=[1,8] bench.output_len=128 bench.iters=3"
t lat-8b-off 100 python3 -m xrt bench $L8 executor.fuse_activation=false bench.out_dir=$R/lat-8b-off
t lat-8b-on 100 python3 -m xrt bench $L8 executor.fuse_activation=true bench.out_dir=$R/lat-8b-on
t breakdown-06b-on 60 python3 -m xrt profile profile.mode=breakdown executor=cudagraph "profile.batch=[1,8]"
C1="bench.scenario=serve executor=cudagraph bench.max_concurrency=1 bench.request_rate=[0] bench.num_requests=32"
for i in 1 2; do
  t serve-spin0-$i 60 python3 -m xrt bench $C1 serve.http_spin_ms=0 bench.out_dir=$R/serve-spin0-$i
  t serve-spin10-$i 60 python3 -m xrt bench $C1 serve.http_spin_ms=10 bench.out_dir=$R/serve-spin10-$i
done
cat $R/times.txt; tail -3 $R/tests-gemv.log
grep -h "\[bench\] cudagraph" $R/lat-*.log
for f in $R/serve-*.log; do echo "== $f"; grep -E "Mean TTFT|Server's|HTTP|Mean TPOT" $f; done
grep -E "^## batch" $R/breakdown-06b-on.log; grep -A10 "decode kernels" $R/breakdown-06b-on.log | grep -E "gemv|silu"
tar -czf $OUT/r.tgz -C /tmp r
