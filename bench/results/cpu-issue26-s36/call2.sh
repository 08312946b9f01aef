# Session 36's second call, on the warm machine of cpu-issue26-s35/next.sh (its .fi caches stay on the machine):
# `END_S=560 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s36/call2.sh`. Results in $OUT/r5.tgz after every step.
# 1. Batch-100 TTFT against the prefill step's token budget: scheduler.max_batched_tokens 8192 (the default: eight
#    1024-token prompts a step, 13 steps) / 16384 / 32768, alternating twice. The notes put batch 100's prefill at
#    ~600 TFLOP/s in its GEMMs against ~740 at 8 x 1024: are larger steps' GEMMs faster?
# 2. Where a batch-8 decode step goes with gemv_m8.patch applied (breakdown, exposed times), for the next lever.
source scripts/gpu_env.sh || exit 1
R=/tmp/r5; rm -rf $R; mkdir -p $R; s=$(date +%s)
P=bench/results/cpu-issue26-s34/gemv_m8.patch
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r5.tgz -C /tmp r5; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[100]"
for i in a b; do
  for t in 8192 16384 32768; do
    [ $(left) -gt 150 ] || break 2
    timeout 100 $B scheduler.max_batched_tokens=$t bench.out_dir=$R/t${t}_$i > $R/t${t}_$i.log 2>&1; save t${t}_$i $?
  done
done
git apply $P && { timeout $(( $(left) - 10 )) python3 -m xrt profile profile.mode=breakdown executor=cudagraph \
  "profile.batch=[8]" profile.rows=40 > $R/bd8_m8.log 2>&1; save bd8_m8 $?; git apply -R $P; }
cat $R/gpu.txt $R/times.txt
for f in $R/t*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -iE "replay|exposed" $R/bd8_m8.log | head -20
