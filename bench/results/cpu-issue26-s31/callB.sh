# Session 31's second GPU call (warm machine, carrying [".whl", ".whl-serve"]): next_call.sh's measurements without its tests:
# the batch-1 prefill step part by part, 8B offline batch 1 and served at concurrency 1, the probed 0.6B serve run,
# the prefill attention in a graph.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R; s=$(date +%s)
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/rB.tgz -C /tmp r; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3"
M8="model=qwen3-8b model.load_format=dummy"
[ $(left) -gt 200 ] && { timeout 100 $B $M8 "bench.batch=[1]" bench.out_dir=$R/lat8 > $R/lat8.log 2>&1; save lat8 $?; }
[ $(left) -gt 100 ] && { timeout $(( $(left) - 60 > 200 ? 200 : $(left) - 60 )) python3 -m xrt bench bench.scenario=serve \
  executor=cudagraph $M8 bench.max_concurrency=1 "bench.request_rate=[0]" bench.num_requests=16 bench.out_dir=$R/serve8 \
  > $R/serve8.log 2>&1; save serve8 $?; }
[ $(left) -gt 90 ] && { timeout 60 python3 -m xrt profile profile.mode=step executor=cudagraph "profile.batch=[1]" \
  profile.rows=0 > $R/step1.log 2>&1; save step1 $?; }
if [ $(left) -gt 80 ]; then
  mkdir -p $R/st; XRT_STAMPS=$R/st PYTHONPATH=$PWD/scripts/serve_probe:$PYTHONPATH timeout $(( $(left) - 35 )) \
    python3 -m xrt bench bench.scenario=serve executor=cudagraph bench.max_concurrency=1 "bench.request_rate=[0]" \
    bench.num_requests=32 bench.out_dir=$R/serve > $R/serve.log 2>&1; save serve $?
  python3 scripts/serve_probe/hops.py $R/st > $R/hops.txt 2>&1; save hops 0
fi
[ $(left) -gt 35 ] && { timeout 30 python3 bench/results/cpu-issue26-s27/attn_graph.py > $R/attn_graph.log 2>&1
  save attn_graph $?; }
cat $R/times.txt
for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -E "Mean TTFT|Median TTFT|Server|of which|HTTP round|Mean TPOT" $R/serve8.log $R/serve.log 2>/dev/null
grep -iE 'prefill|step|host|replay' $R/step1.log | head -30; head -40 $R/hops.txt 2>/dev/null
grep -v Warn $R/attn_graph.log 2>/dev/null | tail -14
