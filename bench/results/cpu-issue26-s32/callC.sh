# The next session's first GPU call (carrying [".whl", ".whl-serve"]): session 32's persistent MLP
# (bench/results/cpu-issue26-s32/persistent_mlp.patch) on a GPU. From the repository root:
# `END_S=560 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s32/callC.sh`. In order, while time is left:
# 1. with the patch: its GPU tests (the kernel against the reference, fewer programs than items, the layer switch,
#    the CUDA-graph runner with executor.persistent_mlp=true against the default);
# 2. the kernel timed against the three launches it replaces (mlp_time.py: 28 layers in a graph, tile variants);
# 3. with the variant best over both shapes (mlp_time's best.json) written into the module, end to end, batch 1:
#    executor.persistent_mlp=true against the default, 0.6B two alternating pairs, 8B one; skipped where even that
#    variant is slower than the three launches in mlp_time (its time goes to callB);
# 4. with the patch, the attention, executor and e2e GPU tests (nothing else may break).
# Then, on the warm machine: bench/results/cpu-issue24-s32/callB.sh (issue 24 at concurrency 1).
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R; s=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
git apply bench/results/cpu-issue26-s32/persistent_mlp.patch || exit 1
timeout 200 python3 -m pytest -q -rfE --gpu -m gpu tests/kernels/test_mlp_persistent_gpu.py \
  tests/executor/test_cudagraph_gpu.py -k "persistent or mlp" -p no:cacheprovider > $R/suite-mlp.log 2>&1
save suite-mlp $?
[ $(left) -gt 260 ] && { timeout 200 python3 bench/results/cpu-issue26-s32/mlp_time.py $R/best.json \
  > $R/mlp_time.log 2>&1; save mlp_time $?; }
# the end-to-end A/B (and the suite after it) with the tiles mlp_time found best over both shapes
K=xrt/kernels/mlp_persistent.py; cp $K /tmp/mlp_default.py
[ -f $R/best.json ] && python3 bench/results/cpu-issue26-s32/apply_best.py $R/best.json $K
grep -E "^(BN_A|PREFETCH)" $K > $R/constants.txt
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.batch=[1]"
M8="model=qwen3-8b model.load_format=dummy"
E2E=1; if [ -f $R/best.json ] && ! python3 -c "import json, sys; sys.exit(json.load(open('$R/best.json'))['relative'] >= 1)"
then E2E=0; fi
echo "end to end: $E2E" >> $R/constants.txt
for i in a b; do
  [ $E2E = 1 ] && [ $(left) -gt 100 ] || break
  timeout 45 $B executor.persistent_mlp=true bench.out_dir=$R/lat_on_$i > $R/lat_on_$i.log 2>&1; save on_$i $?
  timeout 45 $B bench.out_dir=$R/lat_off_$i > $R/lat_off_$i.log 2>&1; save off_$i $?
done
if [ $E2E = 1 ] && [ $(left) -gt 150 ]; then
  timeout 70 $B $M8 executor.persistent_mlp=true bench.out_dir=$R/lat8_on > $R/lat8_on.log 2>&1; save on8 $?
  timeout 70 $B $M8 bench.out_dir=$R/lat8_off > $R/lat8_off.log 2>&1; save off8 $?
fi
[ $(left) -gt 60 ] && { timeout $(( $(left) - 10 )) python3 -m pytest -q -rfE --gpu -m gpu \
  tests/kernels/test_decode_attention_gpu.py tests/attention/test_attention_flashinfer_gpu.py \
  tests/executor/test_cudagraph_gpu.py tests/e2e/test_e2e_gpu.py -p no:cacheprovider > $R/suite.log 2>&1
  save suite $?; }
cp /tmp/mlp_default.py $K; git apply -R bench/results/cpu-issue26-s32/persistent_mlp.patch
cat $R/gpu.txt $R/times.txt $R/constants.txt; tail -n 3 $R/suite-mlp.log $R/suite.log; cat $R/mlp_time.log
for f in $R/lat*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
