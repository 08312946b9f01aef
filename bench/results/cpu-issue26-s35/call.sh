# Session 35's second call, on the warm machine of cpu-issue24-s34/call.sh (carrying [".whl", ".whl-serve"]; the
# FlashInfer and Triton caches that call built stay in .fi): `END_S=560 XRT_GIT_COMMIT=<sha> bash
# bench/results/cpu-issue26-s35/call.sh`. Device time was short, so this folds session 34's call2 and call3 into one:
# 1. the whole GPU suite at the committed tree (session 34's executor.l2_prefetch tests among it);
# 2. 0.6B TPOT at batches 1, 2, 8 while time is left, in rounds of four runs: HEAD; gemv_m8.patch (qkv and gate_up
#    at M = 5-8 on the skinny GEMM's tensor-core tile instead of cuBLAS); executor.l2_prefetch=branch; =inline.
# Results in $OUT/r3.tgz after every step.
source scripts/gpu_env.sh || exit 1
R=/tmp/r3; rm -rf $R; mkdir -p $R; s=$(date +%s)
P=bench/results/cpu-issue26-s34/gemv_m8.patch
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r3.tgz -C /tmp r3; }
timeout 300 python3 -m pytest --gpu -m gpu tests -q -p no:cacheprovider > $R/suite.log 2>&1; save suite $?
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1,2,8]"
for i in a b; do
  [ $(left) -gt 170 ] || break
  timeout 60 $B bench.out_dir=$R/head_$i > $R/head_$i.log 2>&1; save head_$i $?
  git apply $P && { timeout 60 $B bench.out_dir=$R/m8_$i > $R/m8_$i.log 2>&1; save m8_$i $?; git apply -R $P; }
  for m in branch inline; do
    [ $(left) -gt 40 ] || break
    timeout 60 $B executor.l2_prefetch=$m bench.out_dir=$R/l2${m}_$i > $R/l2${m}_$i.log 2>&1; save l2${m}_$i $?
  done
done
cat $R/gpu.txt $R/times.txt; tail -n 12 $R/suite.log
for f in $R/head_*.log $R/m8_*.log $R/l2*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
