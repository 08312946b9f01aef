# For the next machine, carrying [".whl", ".whl-serve"] and .fi where this checkout has one (a cache an earlier call
# returned, unpacked with `cat fi.tar.xz.* | tar -xJ`): `END_S=570 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s35/next.sh`.
# Decides whether bench/results/cpu-issue26-s34/gemv_m8.patch lands. In order, results in $OUT/r4.tgz after every step:
# 1. 0.6B TPOT at batches 1 and 8, HEAD / patch alternating twice (session 35 had one pair: 1.517 -> 1.408 ms);
# 2. the whole GPU suite with the patch applied, for the time left (`suite.log`, -rfE: failures and errors named).
#    A fresh machine compiles every Triton kernel the suite uses; if the suite is cut off, run this script again with
#    SUITE_ONLY=1 on the warm machine (its .fi/triton then holds them; 171 s warm in earlier sessions).
# 3. the Triton and FlashInfer caches back as $OUT/fi.tar.xz.* (15 MB parts) for a later fresh machine to carry.
source scripts/gpu_env.sh || exit 1
R=/tmp/r4; rm -rf $R; mkdir -p $R; s=$(date +%s)
P=bench/results/cpu-issue26-s34/gemv_m8.patch
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-570} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r4.tgz -C /tmp r4; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1,8]"
if [ -z "$SUITE_ONLY" ]; then
  for i in a b; do
    timeout 90 $B bench.out_dir=$R/head_$i > $R/head_$i.log 2>&1; save head_$i $?
    git apply $P && { timeout 90 $B bench.out_dir=$R/m8_$i > $R/m8_$i.log 2>&1; save m8_$i $?; git apply -R $P; }
  done
fi
git apply $P && { timeout $(( $(left) - 40 )) python3 -m pytest --gpu -m gpu tests -q -rfE -p no:cacheprovider \
  > $R/suite.log 2>&1; save suite $?; git apply -R $P; }
tar -cJf /tmp/fi.tar.xz .fi/.cache .fi/triton 2>/dev/null && split -b 15M /tmp/fi.tar.xz $OUT/fi.tar.xz.
cat $R/gpu.txt $R/times.txt; tail -n 15 $R/suite.log
for f in $R/head_*.log $R/m8_*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
