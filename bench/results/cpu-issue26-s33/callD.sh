# Session 33's second GPU call (carrying [".whl"]): the persistent MLP with its K loops pipelined through shared
# memory by Triton (STAGES, bench/results/cpu-issue26-s32/persistent_mlp.patch). From the repository root:
# `END_S=360 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s33/callD.sh`. In order, while time is left:
# 1. mlp_time.py --pipelined: 28 layers in a graph, the three launches against the pipelined variants and session
#    33's best unpipelined one (bench/results/h100-issue26-s12), on the 0.6B and 8B shapes;
# 2. the kernel's GPU tests (every variant against the reference);
# 3. only where the best variant beats the three launches on average: that variant written into the module, then
#    end to end at batch 1, executor.persistent_mlp=true against the default (0.6B two alternating pairs, 8B one).
source scripts/gpu_env.sh || exit 1
R=/tmp/r; rm -rf $R; mkdir -p $R; s=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-360} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
git apply bench/results/cpu-issue26-s32/persistent_mlp.patch || exit 1
timeout $(( $(left) - 60 )) python3 bench/results/cpu-issue26-s32/mlp_time.py --pipelined $R/best.json \
  > $R/mlp_time.log 2>&1; save mlp_time $?
[ $(left) -gt 40 ] && { timeout $(( $(left) - 10 )) python3 -m pytest -q -rfE --gpu -m gpu \
  tests/kernels/test_mlp_persistent_gpu.py -p no:cacheprovider > $R/suite-mlp.log 2>&1; save suite-mlp $?; }
K=xrt/kernels/mlp_persistent.py; cp $K /tmp/mlp_default.py
E2E=0; if [ -f $R/best.json ] && python3 -c "import json, sys; sys.exit(json.load(open('$R/best.json'))['relative'] >= 1)"
then E2E=1; python3 bench/results/cpu-issue26-s32/apply_best.py $R/best.json $K; fi
grep -E "^(BN_A|PREFETCH|STAGES)" $K > $R/constants.txt; echo "end to end: $E2E" >> $R/constants.txt
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1]"
M8="model=qwen3-8b model.load_format=dummy"
for i in a b; do
  [ $E2E = 1 ] && [ $(left) -gt 100 ] || break
  timeout 45 $B executor.persistent_mlp=true bench.out_dir=$R/lat_on_$i > $R/lat_on_$i.log 2>&1; save on_$i $?
  timeout 45 $B bench.out_dir=$R/lat_off_$i > $R/lat_off_$i.log 2>&1; save off_$i $?
done
if [ $E2E = 1 ] && [ $(left) -gt 150 ]; then
  timeout 70 $B $M8 executor.persistent_mlp=true bench.out_dir=$R/lat8_on > $R/lat8_on.log 2>&1; save on8 $?
  timeout 70 $B $M8 bench.out_dir=$R/lat8_off > $R/lat8_off.log 2>&1; save off8 $?
fi
cp /tmp/mlp_default.py $K; git apply -R bench/results/cpu-issue26-s32/persistent_mlp.patch
cat $R/gpu.txt $R/times.txt $R/constants.txt; tail -n 3 $R/suite-mlp.log; cat $R/mlp_time.log
for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
