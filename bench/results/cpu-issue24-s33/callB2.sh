# Issue 24's H200 check cut to what session 33's device time allows (carrying [".whl", ".whl-serve", ".fi/.cache"],
# the FlashInfer cache without its f16 and fa2 modules, to stay under the carry limit). From the repository root:
# `END_S=220 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue24-s33/callB2.sh`. In order, while time is left:
# 0. one untimed offline run, so that the timed ones find every kernel compiled (a fresh machine);
# 1. 0.6B offline batch 1 and the server at concurrency 1, alternating twice (the TTFT excess and /metrics TTFT);
# 2. Qwen3-8B (dummy weights) offline batch 1, then served at concurrency 1.
# The rates and the prefill head of cpu-issue24-s32/callB.sh are left out. Results in $OUT/r.tgz after each step.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; rm -rf $R; mkdir -p $R; s=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-220} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1]"
S="python3 -m xrt bench bench.scenario=serve executor=cudagraph"
C1="bench.max_concurrency=1 bench.request_rate=[0]"
M8="model=qwen3-8b model.load_format=dummy"
timeout $(( $(left) - 60 )) $B bench.iters=1 bench.out_dir=$R/warm > $R/warm.log 2>&1; save warm $?
for i in a b; do
  [ $(left) -gt 70 ] || break
  timeout 60 $B bench.out_dir=$R/lat_$i > $R/lat_$i.log 2>&1; save lat_$i $?
  timeout 60 $S $C1 bench.num_requests=32 bench.out_dir=$R/serve_$i > $R/serve_$i.log 2>&1; save serve_$i $?
done
[ $(left) -gt 100 ] && { timeout 100 $B $M8 bench.out_dir=$R/lat8 > $R/lat8.log 2>&1; save lat8 $?; }
[ $(left) -gt 50 ] && { timeout $(( $(left) - 5 )) $S $M8 $C1 bench.num_requests=16 bench.out_dir=$R/serve8 \
  > $R/serve8.log 2>&1; save serve8 $?; }
cat $R/gpu.txt $R/times.txt
for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -E "Mean TTFT|Server|of which|HTTP round|Mean TPOT" $R/serve*.log
