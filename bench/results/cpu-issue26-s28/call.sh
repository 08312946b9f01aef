# Session 28's GPU call (one, the device budget allowing no second): from the repository root, carrying
# [".whl", ".fi", ".whl-serve"]: `END_S=... bash bench/results/cpu-issue26-s28/call.sh` (END_S: seconds it may run
# after the install; RESERVE: seconds kept from the suite for what follows, 150 unless given). In order, while time
# is left:
# 1. the whole GPU suite on the tree as committed (owed since adac371; this session's staging, pipe and page-key
#    changes), its kernel and backend tests first;
# 2. session 27's decode_meta_before_wait.patch against the committed tree, alternating, 0.6B batches 1 and 2;
# 3. if the patch was faster (its batch-1 TPOT lower in both pairs, its batch-2 mean no higher: meta.txt), the GPU
#    tests of the kernels it touches with it applied;
# 4. a probed serve run (0.6B, concurrency 1).
source scripts/gpu_env.sh || exit 1
P=bench/results/cpu-issue26-s27
R=/tmp/r1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
s=$(date +%s)
left() { echo $(( ${END_S:-530} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r1.tgz -C /tmp r1; }
on() { git apply "$P/$1.patch" 2>/dev/null || patch -s -p1 < "$P/$1.patch"; }
off() { git apply -R "$P/$1.patch" 2>/dev/null || patch -s -R -p1 < "$P/$1.patch"; }
tpot() { grep -h "\[bench\] cudagraph batch $2:" $R/lat_$1.log | sed 's/.*TPOT \([0-9.]*\) ms.*/\1/'; }
KT="tests/kernels/test_decode_attention_gpu.py tests/attention/test_attention_flashinfer_gpu.py"
timeout $(( $(left) - ${RESERVE:-150} )) python3 -m pytest -v -rfE --gpu -m gpu $KT tests/executor/test_prefill_graph_gpu.py tests \
  -p no:cacheprovider > $R/suite.log 2>&1; save suite $?
tar -czf $OUT/fi.tgz .fi
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3"
for run in meta_a base_a meta_b base_b; do
  [ $(left) -lt 70 ] && break
  [ ${run%_*} = meta ] && on decode_meta_before_wait
  timeout 60 $B "bench.batch=[1,2]" bench.out_dir=$R/lat_$run > $R/lat_$run.log 2>&1; save lat_$run $?
  [ ${run%_*} = meta ] && off decode_meta_before_wait
done
keep=$(python3 - "$(tpot meta_a 1) $(tpot base_a 1) $(tpot meta_b 1) $(tpot base_b 1)" \
  "$(tpot meta_a 2) $(tpot base_a 2) $(tpot meta_b 2) $(tpot base_b 2)" <<'PY'
import sys
try:
    ma, ba, mb, bb = map(float, sys.argv[1].split()); m2a, b2a, m2b, b2b = map(float, sys.argv[2].split())
    print(int(ma < ba and mb < bb and m2a + m2b <= b2a + b2b))
except ValueError:
    print(0)
PY
)
echo "keep decode_meta_before_wait: $keep" > $R/meta.txt
if [ "$keep" = 1 ] && [ $(left) -gt 40 ]; then
  on decode_meta_before_wait
  timeout $(( $(left) - 5 )) python3 -m pytest -q -rfE --gpu -m gpu $KT -p no:cacheprovider > $R/suite-meta.log 2>&1
  save suite-meta $?; off decode_meta_before_wait
fi
if [ $(left) -gt 45 ]; then
  mkdir -p $R/st; XRT_STAMPS=$R/st PYTHONPATH=$PWD/scripts/serve_probe:$PYTHONPATH timeout $(( $(left) - 5 )) \
    python3 -m xrt bench bench.scenario=serve executor=cudagraph bench.max_concurrency=1 "bench.request_rate=[0]" \
    bench.num_requests=32 bench.out_dir=$R/serve > $R/serve.log 2>&1; save serve $?
  python3 scripts/serve_probe/hops.py $R/st > $R/hops.txt 2>&1; save hops 0
fi
cat $R/gpu.txt $R/times.txt $R/meta.txt; for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
tail -8 $R/suite.log; tail -3 $R/suite-meta.log 2>/dev/null
grep -E "Mean TTFT|Server|of which|HTTP round|Mean TPOT" $R/serve.log 2>/dev/null; head -40 $R/hops.txt 2>/dev/null
