# The next session's GPU call (after session 30). From the repository root, carrying [".whl", ".fi", ".whl-serve"]:
# `END_S=... XRT_GIT_COMMIT=<sha> bash bench/results/h100-issue26-s10/next_call.sh`. In order, while time is left:
# 1. the GPU tests of the decode attention, its backend, the CUDA-graph executor and e2e at the committed tree
#    (session 30 landed the split count by power-of-two bucket after its GPU runs: batches 3, 5, 6 and 7 in eager);
# 2. the engine's batch-1 prefill step, host part by part (`xrt profile profile.mode=step`: the TTFT's non-kernel time);
# 3. Qwen3-8B (dummy weights): offline batch-1 TTFT / TPOT, then the server at concurrency 1 (issue 24's 8B TTFT
#    excess, last measured at f6ac8f3 before sessions 26-28's host changes);
# 4. the 0.6B server at concurrency 1 with the serve probe's stamps (scripts/serve_probe);
# 5. the prefill attention timed in a CUDA graph (cpu-issue26-s27/attn_graph.py).
# Results in $OUT/r.tgz (the FlashInfer cache is not returned: its tarball is over the size a call brings back).
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
s=$(date +%s)
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
timeout 300 python3 -m pytest -q -rfE --gpu -m gpu tests/kernels/test_decode_attention_gpu.py \
  tests/attention/test_attention_flashinfer_gpu.py tests/executor/test_cudagraph_gpu.py tests/e2e/test_e2e_gpu.py \
  -p no:cacheprovider > $R/suite.log 2>&1; save suite $?
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3"
[ $(left) -gt 260 ] && { timeout 60 python3 -m xrt profile profile.mode=step executor=cudagraph "profile.batch=[1]" \
  profile.rows=0 > $R/step1.log 2>&1; save step1 $?; }
M8="model=qwen3-8b model.load_format=dummy"
[ $(left) -gt 200 ] && { timeout 100 $B $M8 "bench.batch=[1]" bench.out_dir=$R/lat8 > $R/lat8.log 2>&1; save lat8 $?; }
[ $(left) -gt 100 ] && { timeout $(( $(left) - 40 )) python3 -m xrt bench bench.scenario=serve executor=cudagraph $M8 \
  bench.max_concurrency=1 "bench.request_rate=[0]" bench.num_requests=16 bench.out_dir=$R/serve8 > $R/serve8.log 2>&1
  save serve8 $?; }
if [ $(left) -gt 80 ]; then
  mkdir -p $R/st; XRT_STAMPS=$R/st PYTHONPATH=$PWD/scripts/serve_probe:$PYTHONPATH timeout $(( $(left) - 35 )) \
    python3 -m xrt bench bench.scenario=serve executor=cudagraph bench.max_concurrency=1 "bench.request_rate=[0]" \
    bench.num_requests=32 bench.out_dir=$R/serve > $R/serve.log 2>&1; save serve $?
  python3 scripts/serve_probe/hops.py $R/st > $R/hops.txt 2>&1; save hops 0
fi
[ $(left) -gt 35 ] && { timeout 30 python3 bench/results/cpu-issue26-s27/attn_graph.py > $R/attn_graph.log 2>&1
  save attn_graph $?; }
cat $R/gpu.txt $R/times.txt; tail -3 $R/suite.log
for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
grep -E "Mean TTFT|Median TTFT|Server|of which|HTTP round|Mean TPOT" $R/serve8.log $R/serve.log 2>/dev/null
grep -iE 'prefill|step|host|replay' $R/step1.log | head -30; head -40 $R/hops.txt 2>/dev/null
grep -v Warn $R/attn_graph.log 2>/dev/null | tail -14
