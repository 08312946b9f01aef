# Session 29's second GPU call, after bench/results/cpu-issue26-s28/call.sh (which runs the owed suite and the
# decode_meta_before_wait A/B). From the repository root, carrying [".whl", ".fi", ".whl-serve"]:
# `END_S=... bash bench/results/cpu-issue26-s29/call2.sh`. In order, while time is left:
# 1. session 27's small_decode_to_batch8.patch against the committed tree, alternating, 0.6B batches 4 and 8;
# 2. the engine's batch-1 prefill step, host part by part (`xrt profile profile.mode=step`: the TTFT's non-kernel time);
# 3. Qwen3-8B (dummy weights): offline batch-1 TTFT / TPOT, then the server at concurrency 1 (issue 24's 8B TTFT
#    excess, last measured at f6ac8f3 before sessions 26-28's host changes);
# 4. the prefill attention timed in a CUDA graph (cpu-issue26-s27/attn_graph.py).
source scripts/gpu_env.sh || exit 1
P=bench/results/cpu-issue26-s27
R=/tmp/r2; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
s=$(date +%s)
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r2.tgz -C /tmp r2; }
on() { git apply "$P/$1.patch" 2>/dev/null || patch -s -p1 < "$P/$1.patch"; }
off() { git apply -R "$P/$1.patch" 2>/dev/null || patch -s -R -p1 < "$P/$1.patch"; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3"
for run in b8_a base_a b8_b base_b; do
  [ ${run%_*} = b8 ] && [ $(left) -lt 300 ] && break  # a pair is started only when both halves can run
  [ ${run%_*} = b8 ] && on small_decode_to_batch8
  lim=70; [ $run = b8_a ] && lim=170  # the first run compiles what a cold .fi lacks
  timeout $lim $B "bench.batch=[4,8]" bench.out_dir=$R/lat48_$run > $R/lat48_$run.log 2>&1; save lat48_$run $?
  [ ${run%_*} = b8 ] && off small_decode_to_batch8
done
[ $(left) -gt 260 ] && { timeout 60 python3 -m xrt profile profile.mode=step executor=cudagraph "profile.batch=[1]" \
  profile.rows=0 > $R/step1.log 2>&1; save step1 $?; }
M8="model=qwen3-8b model.load_format=dummy"
[ $(left) -gt 200 ] && { timeout 100 $B $M8 "bench.batch=[1]" bench.out_dir=$R/lat8 > $R/lat8.log 2>&1; save lat8 $?; }
[ $(left) -gt 100 ] && { timeout $(( $(left) - 40 )) python3 -m xrt bench bench.scenario=serve executor=cudagraph $M8 \
  bench.max_concurrency=1 "bench.request_rate=[0]" bench.num_requests=16 bench.out_dir=$R/serve8 > $R/serve8.log 2>&1
  save serve8 $?; }
[ $(left) -gt 35 ] && { timeout 30 python3 $P/attn_graph.py > $R/attn_graph.log 2>&1; save attn_graph $?; }
tar -czf $OUT/fi.tgz .fi
cat $R/gpu.txt $R/times.txt; for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -E "Mean TTFT|Median TTFT|Server|of which|HTTP round|Mean TPOT" $R/serve8.log 2>/dev/null
grep -iE 'prefill|step|host|replay' $R/step1.log | head -30
grep -v Warn $R/attn_graph.log 2>/dev/null | tail -14
