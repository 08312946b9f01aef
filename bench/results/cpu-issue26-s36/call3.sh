# Measures the prefill's fused-epilogue GEMMs (session 36, off by default until measured): executor.fuse_qkv_epilogue
# (the qkv GEMM with the q/k norm, RoPE and KV write in its epilogue, xrt/kernels/qkv_gemm.py) and
# executor.fuse_prefill_activation (the gate_up GEMM with silu(gate) * up in its epilogue, gate_up_gemm.py). As a
# fresh machine's first call carrying [".whl", ".fi-pack"] (the caches compressed; scripts/gpu_env.sh unpacks them):
# `END_S=570 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s36/call3.sh`.
# In order while time is left, results in $OUT/r8.tgz after every step:
# 1. the new GPU tests (both kernels against their references at the 0.6B / 8B shapes, the ops' routing, the
#    executor with both switches on against off);
# 2. the kernels scenario's prefill_epilogues lines at 1024 and 8192 tokens (cuBLAS + the separate kernel, cuBLAS
#    alone, each fused kernel's tilings), 0.6B then 8B;
# 3. 0.6B TTFT at batches 1 and 8 (output 16 tokens: only the prefill matters): off / qkv / activation / both,
#    twice, then batch 100 off / both;
# 4. the batch-8 prefill kernel by kernel with both switches on (`xrt profile`), then gemm_probe.py (plain Triton
#    GEMMs, pointer loads and TMA, against cuBLAS at the qkv and gate_up shapes);
# 5. the whole GPU suite for the time left (`suite.log`; SUITE_ONLY=1 runs only this, on a warm machine).
source scripts/gpu_env.sh || exit 1
R=/tmp/r8; rm -rf $R; mkdir -p $R; s=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-570} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r8.tgz -C /tmp r8; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.output_len=16"
K="python3 -m xrt bench bench.scenario=kernels bench.kernels=[prefill_epilogues] bench.kernel_tokens=[1024,8192]"
Q="executor.fuse_qkv_epilogue"; A="executor.fuse_prefill_activation"
declare -A SW=([off]="" [qkv]="$Q=true" [act]="$A=true" [both]="$Q=true $A=true")
if [ -z "$SUITE_ONLY" ]; then
  timeout 100 python3 -m pytest --gpu -m gpu tests/kernels/test_prefill_gemm_gpu.py tests/executor/test_cudagraph_gpu.py \
    -k "prefill_gemm or linear or epilogue" -q -rfE -p no:cacheprovider > $R/tests.log 2>&1; save tests $?
  timeout 60 $K bench.out_dir=$R/kern > $R/kern.log 2>&1; save kern $?
  timeout 60 $K model=qwen3-8b bench.out_dir=$R/kern8 > $R/kern8.log 2>&1; save kern8 $?
  for i in a b; do
    for v in off qkv act both; do
      [ $(left) -gt 60 ] || break 2
      timeout 60 $B "bench.batch=[1,8]" ${SW[$v]} bench.out_dir=$R/ab_${v}_$i > $R/ab_${v}_$i.log 2>&1
      save ab_${v}_$i $?
    done
  done
  for v in off both; do
    [ $(left) -gt 80 ] || break
    timeout 75 $B "bench.batch=[100]" ${SW[$v]} bench.out_dir=$R/b100_$v > $R/b100_$v.log 2>&1; save b100_$v $?
  done
  [ $(left) -gt 100 ] && { timeout 60 python3 -m xrt profile profile.mode=breakdown executor=cudagraph \
    "profile.batch=[8]" profile.rows=30 ${SW[both]} > $R/bd8_both.log 2>&1; save bd8_both $?; }
  [ $(left) -gt 90 ] && { timeout 80 python3 bench/results/cpu-issue26-s36/gemm_probe.py > $R/gemm_probe.log 2>&1
    save gemm_probe $?; }
fi
[ $(left) -gt 60 ] && { timeout $(( $(left) - 20 )) python3 -m pytest --gpu -m gpu tests -q -rfE -p no:cacheprovider \
  > $R/suite.log 2>&1; save suite $?; }
cat $R/gpu.txt $R/times.txt; tail -n 6 $R/tests.log $R/suite.log 2>/dev/null
grep -h '^|' $R/kern/results.md $R/kern8/results.md 2>/dev/null | grep -v "^|--" | head -50
for f in $R/ab_*.log $R/b100_*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
