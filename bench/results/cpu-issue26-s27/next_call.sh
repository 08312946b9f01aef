# The GPU call prepared in session 27 and never run (no machine came). From the repository root, carrying
# [".whl", ".fi"]: `bash bench/results/cpu-issue26-s27/next_call.sh` (END_S: when the test suite must stop).
# 1. decode_meta_before_wait.patch A/B against the tree as committed (alternating, 0.6B, batches 1 and 2);
# 2. the whole GPU suite with the patch applied (owed since adac371: session 24's split prefill graphs and session
#    25's executor.prefill_attention have not had a suite run, and their GPU tests have never run on a GPU);
# 3. small_decode_to_batch8.patch on top, A/B at batches 4 and 8, and the prefill attention in a graph
#    (attn_graph.py), while time is left.
source scripts/gpu_env.sh || exit 1
P=bench/results/cpu-issue26-s27
R=/tmp/r1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
s=$(date +%s)
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r1.tgz -C /tmp r1; }
on() { git apply "$P/$1.patch" 2>/dev/null || patch -s -p1 < "$P/$1.patch"; }
off() { git apply -R "$P/$1.patch" 2>/dev/null || patch -s -R -p1 < "$P/$1.patch"; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3"
for run in meta_a base_a meta_b base_b; do
  [ ${run%_*} = meta ] && on decode_meta_before_wait
  timeout 150 $B "bench.batch=[1,2]" bench.out_dir=$R/lat_$run > $R/lat_$run.log 2>&1; save lat_$run $?
  [ ${run%_*} = meta ] && off decode_meta_before_wait
  [ $run = meta_a ] && { tar -czf $OUT/fi.tgz .fi; save fi 0; }
done
on decode_meta_before_wait
timeout $(( ${END_S:-500} - ($(date +%s)-s) )) python3 -m pytest -v -rfE --gpu -m gpu \
  tests/kernels/test_decode_attention_gpu.py tests/attention/test_attention_flashinfer_gpu.py \
  tests/executor/test_prefill_graph_gpu.py tests -p no:cacheprovider > $R/suite.log 2>&1; save suite $?
tar -czf $OUT/fi.tgz .fi
for run in b8_a meta_a2 b8_b meta_b2; do
  [ $(( $(date +%s)-s )) -gt 540 ] && break
  [ ${run%_*} = b8 ] && on small_decode_to_batch8
  timeout 60 $B "bench.batch=[4,8]" bench.out_dir=$R/lat48_$run > $R/lat48_$run.log 2>&1; save lat48_$run $?
  [ ${run%_*} = b8 ] && off small_decode_to_batch8
done
[ $(( $(date +%s)-s )) -lt 560 ] && { timeout 30 python3 $P/attn_graph.py > $R/attn_graph.log 2>&1; save attn_graph $?; }
cat $R/gpu.txt $R/times.txt; for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
tail -8 $R/suite.log; grep -v Warn $R/attn_graph.log 2>/dev/null | tail -14
