# Session 34's issue-26 A/B call (carrying [".whl", ".whl-serve"]; best on the warm machine of
# cpu-issue24-s34/call.sh): `END_S=560 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s34/call2.sh`.
# In order, while time is left (results in $OUT/r2.tgz after every step):
# 1. the GPU tests of executor.l2_prefetch (the kernel, and greedy / replayed decode unchanged in both modes);
# 2. 0.6B TPOT at batches 1, 2, 8, two rounds of four runs: HEAD; gemv_m8.patch (qkv and gate_up at M = 5-8 on the
#    skinny GEMM's tensor-core tile instead of cuBLAS); executor.l2_prefetch=branch; executor.l2_prefetch=inline;
# 3. the batch-1 decode replay kernel by kernel (exposed times) with l2_prefetch off, branch and inline.
source scripts/gpu_env.sh || exit 1
R=/tmp/r2; rm -rf $R; mkdir -p $R; s=$(date +%s)
P=bench/results/cpu-issue26-s34/gemv_m8.patch
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r2.tgz -C /tmp r2; }
timeout 150 python3 -m pytest --gpu -m gpu -q -p no:cacheprovider tests/kernels/test_kernels_gpu.py \
  tests/executor/test_cudagraph_gpu.py -k "prefetch" > $R/tests.log 2>&1; save tests $?
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1,2,8]"
for i in a b; do
  [ $(left) -gt 160 ] || break
  timeout 70 $B bench.out_dir=$R/head_$i > $R/head_$i.log 2>&1; save head_$i $?
  git apply $P && { timeout 70 $B bench.out_dir=$R/m8_$i > $R/m8_$i.log 2>&1; save m8_$i $?; git apply -R $P; }
  for m in branch inline; do
    timeout 70 $B executor.l2_prefetch=$m bench.out_dir=$R/l2${m}_$i > $R/l2${m}_$i.log 2>&1; save l2${m}_$i $?
  done
done
BD="python3 -m xrt profile profile.mode=breakdown executor=cudagraph profile.batch=[1]"
for m in off branch inline; do
  [ $(left) -gt 45 ] || break
  timeout 40 $BD executor.l2_prefetch=$m > $R/bd_$m.log 2>&1; save bd_$m $?
done
cat $R/gpu.txt $R/times.txt; tail -n 2 $R/tests.log
for f in $R/head_*.log $R/m8_*.log $R/l2*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -h "replay" $R/bd_*.log | head -12
