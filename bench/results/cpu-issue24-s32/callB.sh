# Session 32's H200 call for issue 24's benchmark at the committed tree (carrying [".whl", ".whl-serve"]):
# `END_S=560 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue24-s32/callB.sh`. In order, while time is left:
# 1. 0.6B offline batch 1 and the server at concurrency 1, alternating twice (the TTFT excess and /metrics TTFT);
# 2. Qwen3-8B (dummy weights) offline batch 1, then served at concurrency 1;
# 3. the 0.6B server at request rates 1, 4, 16, 64 (64 requests each), then 8B at 4, 16, 64;
# 4. the batch-1 prefill step part by part with a prefill graph head of 1 layer and of 2 (the default), alternating.
# Results in $OUT/r.tgz, saved after every step.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R; s=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1]"
S="python3 -m xrt bench bench.scenario=serve executor=cudagraph"
C1="bench.max_concurrency=1 bench.request_rate=[0]"
M8="model=qwen3-8b model.load_format=dummy"
for i in a b; do
  [ $(left) -gt 120 ] || break
  timeout 60 $B bench.out_dir=$R/lat_$i > $R/lat_$i.log 2>&1; save lat_$i $?
  timeout 60 $S $C1 bench.num_requests=32 bench.out_dir=$R/serve_$i > $R/serve_$i.log 2>&1; save serve_$i $?
done
[ $(left) -gt 120 ] && { timeout 100 $B $M8 bench.out_dir=$R/lat8 > $R/lat8.log 2>&1; save lat8 $?; }
[ $(left) -gt 80 ] && { timeout 90 $S $M8 $C1 bench.num_requests=16 bench.out_dir=$R/serve8 > $R/serve8.log 2>&1
  save serve8 $?; }
[ $(left) -gt 130 ] && { timeout $(( $(left) - 100 )) $S bench.num_requests=64 "bench.request_rate=[1,4,16,64]" \
  bench.out_dir=$R/rates > $R/rates.log 2>&1; save rates $?; }
[ $(left) -gt 140 ] && { timeout $(( $(left) - 80 )) $S $M8 bench.num_requests=64 "bench.request_rate=[4,16,64]" \
  bench.out_dir=$R/rates8 > $R/rates8.log 2>&1; save rates8 $?; }
P="python3 -m xrt profile profile.mode=step executor=cudagraph profile.batch=[1] profile.rows=0"
for h in 1 2 1 2; do
  [ $(left) -gt 40 ] || break
  timeout 35 $P executor.prefill_graph_head_layers=$h > $R/step_head$h.$(date +%s).log 2>&1; save step_head$h $?
done
cat $R/gpu.txt $R/times.txt
for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -E "Mean TTFT|Server|of which|HTTP round|Mean TPOT" $R/serve*.log
grep -h 'the step, start to end\|graph launch\|idle before' $R/step_head*.log
cat $R/rates/results.md $R/rates8/results.md 2>/dev/null | grep '^|'
