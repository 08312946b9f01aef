# Session 34's call for issue 24's benchmark at the committed tree, as a fresh machine's first call (carrying
# [".whl", ".whl-serve"]): `END_S=575 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue24-s34/call.sh`.
# In order, while time is left (results in $OUT/r.tgz after every step):
# 0. one untimed offline run, so that the timed ones find every kernel compiled; the FlashInfer cache it built goes
#    back as $OUT/fi.tar.xz.* (15 MB parts) for later calls to carry;
# 1. 0.6B offline batch 1 and the server at concurrency 1, alternating twice (the TTFT excess and /metrics TTFT);
# 2. Qwen3-8B (dummy weights) offline batch 1, then served at concurrency 1;
# 3. the 0.6B server at request rates 1, 4, 16, 64 (32 requests each), then 8B the same.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; rm -rf $R; mkdir -p $R; s=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-575} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1]"
S="python3 -m xrt bench bench.scenario=serve executor=cudagraph"
C1="bench.max_concurrency=1 bench.request_rate=[0]"
M8="model=qwen3-8b model.load_format=dummy"
RATES="bench.num_requests=32 bench.request_rate=[1,4,16,64]"
timeout $(( $(left) - 60 )) $B bench.iters=1 bench.out_dir=$R/warm > $R/warm.log 2>&1; save warm $?
tar -cJf /tmp/fi.tar.xz .fi/.cache 2>/dev/null && split -b 15M /tmp/fi.tar.xz $OUT/fi.tar.xz.
for i in a b; do
  [ $(left) -gt 120 ] || break
  timeout 60 $B bench.out_dir=$R/lat_$i > $R/lat_$i.log 2>&1; save lat_$i $?
  timeout 60 $S $C1 bench.num_requests=32 bench.out_dir=$R/serve_$i > $R/serve_$i.log 2>&1; save serve_$i $?
done
[ $(left) -gt 120 ] && { timeout 100 $B $M8 bench.out_dir=$R/lat8 > $R/lat8.log 2>&1; save lat8 $?; }
[ $(left) -gt 90 ] && { timeout 90 $S $M8 $C1 bench.num_requests=16 bench.out_dir=$R/serve8 > $R/serve8.log 2>&1
  save serve8 $?; }
[ $(left) -gt 90 ] && { timeout 100 $S $RATES bench.out_dir=$R/rates > $R/rates.log 2>&1; save rates $?; }
[ $(left) -gt 100 ] && { timeout $(( $(left) - 5 )) $S $M8 $RATES bench.out_dir=$R/rates8 > $R/rates8.log 2>&1
  save rates8 $?; }
cat $R/gpu.txt $R/times.txt
for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -E "Mean TTFT|Server|of which|HTTP round|Mean TPOT" $R/serve*.log
cat $R/rates/results.md $R/rates8/results.md 2>/dev/null | grep '^|'
ls -la $OUT
