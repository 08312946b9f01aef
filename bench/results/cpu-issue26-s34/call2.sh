# Session 34's issue-26 call (carrying [".whl", ".whl-serve"]; on the machine of cpu-issue24-s34/call.sh or a fresh
# one): `END_S=560 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s34/call2.sh`. In order, while time is left:
# 1. batch-8 TPOT with 0.6B's qkv and gate_up in cuBLAS (HEAD) and on the skinny GEMM's tensor-core tile
#    (gemv_m8.patch), alternating twice, HEAD first; a batch-1 row in each run as the control;
# 2. with the patch: the gemv kernel bench at M = 8 (every candidate against cuBLAS, alone);
# 3. with the patch: the whole GPU suite (`pytest --gpu -m gpu tests`).
# The patch is reverted at the end. Results in $OUT/r2.tgz after every step.
source scripts/gpu_env.sh || exit 1
R=/tmp/r2; rm -rf $R; mkdir -p $R; s=$(date +%s)
P=bench/results/cpu-issue26-s34/gemv_m8.patch
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r2.tgz -C /tmp r2; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1,8]"
for i in a b; do
  [ $(left) -gt 200 ] || break
  timeout 80 $B bench.out_dir=$R/head_$i > $R/head_$i.log 2>&1; save head_$i $?
  git apply $P && { timeout 80 $B bench.out_dir=$R/m8_$i > $R/m8_$i.log 2>&1; save m8_$i $?; git apply -R $P; }
done
git apply $P || exit 1
[ $(left) -gt 150 ] && { timeout 60 python3 -m xrt bench bench.scenario=kernels "bench.kernels=[gemv]" \
  "bench.batch=[8]" bench.out_dir=$R/gemv8 > $R/gemv8.log 2>&1; save gemv8 $?; }
[ $(left) -gt 60 ] && { timeout $(( $(left) - 10 )) python3 -m pytest --gpu -m gpu tests -q -p no:cacheprovider \
  > $R/suite.log 2>&1; save suite $?; }
git apply -R $P
cat $R/gpu.txt $R/times.txt
for f in $R/head_*.log $R/m8_*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -E "^\| (qkv|gate_up) \| 8 \| (torch|dot m16 n32 k128)" $R/gemv8/results.md 2>/dev/null
tail -n 3 $R/suite.log
