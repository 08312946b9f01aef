# Measures the prefill's fused GEMMs (sessions 36-37, all off by default until measured): executor.fuse_qkv_epilogue
# (qkv GEMM + q/k norm, RoPE, KV write), executor.fuse_prefill_activation (gate_up GEMM + silu(gate) * up) and
# executor.fuse_prefill_norms (with both: the RMSNorms as those GEMMs' prologue, the residual adds in o_proj's and
# down's epilogue, xrt/kernels/residual_gemm.py). Supersedes cpu-issue26-s36/call3.sh. As a fresh machine's first call
# carrying [".whl", ".fi-pack"]: `END_S=570 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s37/call.sh`.
# In order while time is left, results in $OUT/r9.tgz after every step:
# 1. the GPU tests of the kernels (against their references, 0.6B / 8B shapes, the ops' routing) and of the executor
#    with the switches on against off (they compile the default tiles the runs below take);
# 2. 0.6B TTFT at batches 1 and 8 (output 16 tokens: only the prefill matters; decode steps never take the switches):
#    off / qkv / act / both / all (both + norms), then off / both / all again; then batch 100 off / both / all;
# 3. the kernels scenario's prefill_epilogues lines at 1024 and 8192 tokens (cuBLAS + the separate kernel, cuBLAS
#    alone, each fused kernel's tilings: each a compile), 0.6B then 8B;
# 4. the batch-8 prefill kernel by kernel with all three on (`xrt profile`);
# 5. the whole GPU suite for the time left (`suite.log`);
# 6. the FlashInfer and Triton caches back as $OUT/fi.tar.xz.* (15 MB parts: the next .fi-pack, new kernels compiled).
# STEPS picks some of them (default "tests ab b100 kern bd8 suite"): a first call will not get past the A/B, so a
# second call on the warm machine runs `STEPS="kern bd8 suite"` (each call's r9.tgz holds its own steps only).
source scripts/gpu_env.sh || exit 1
R=/tmp/r9; rm -rf $R; mkdir -p $R; s=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-570} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r9.tgz -C /tmp r9; }
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3 bench.output_len=16"
K="python3 -m xrt bench bench.scenario=kernels bench.kernels=[prefill_epilogues] bench.kernel_tokens=[1024,8192]"
Q="executor.fuse_qkv_epilogue=true"; A="executor.fuse_prefill_activation=true"; N="executor.fuse_prefill_norms=true"
declare -A SW=([off]="" [qkv]="$Q" [act]="$A" [both]="$Q $A" [all]="$Q $A $N")
STEPS=" ${STEPS:-tests ab b100 kern bd8 suite} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
if want tests; then
  timeout 120 python3 -m pytest --gpu -m gpu tests/kernels/test_prefill_gemm_gpu.py \
    "tests/executor/test_cudagraph_gpu.py::test_prefill_epilogues_match_the_unfused" -q -rfE -p no:cacheprovider \
    > $R/tests.log 2>&1; save tests $?
fi
if want ab; then
  for run in off_a qkv_a act_a both_a all_a off_b both_b all_b; do
    [ $(left) -gt 60 ] || break
    timeout 60 $B "bench.batch=[1,8]" ${SW[${run%_*}]} bench.out_dir=$R/ab_$run > $R/ab_$run.log 2>&1
    save ab_$run $?
  done
fi
if want b100; then
  for v in off both all; do
    [ $(left) -gt 80 ] || break
    timeout 75 $B "bench.batch=[100]" ${SW[$v]} bench.out_dir=$R/b100_$v > $R/b100_$v.log 2>&1; save b100_$v $?
  done
fi
if want kern; then
  [ $(left) -gt 180 ] && { timeout 150 $K bench.out_dir=$R/kern > $R/kern.log 2>&1; save kern $?; }
  [ $(left) -gt 180 ] && { timeout 150 $K model=qwen3-8b bench.out_dir=$R/kern8 > $R/kern8.log 2>&1; save kern8 $?; }
fi
if want bd8; then
  [ $(left) -gt 100 ] && { timeout 60 python3 -m xrt profile profile.mode=breakdown executor=cudagraph \
    "profile.batch=[8]" profile.rows=30 ${SW[all]} > $R/bd8_all.log 2>&1; save bd8_all $?; }
fi
want suite && [ $(left) -gt 60 ] && { timeout $(( $(left) - 30 )) python3 -m pytest --gpu -m gpu tests -q -rfE \
  -p no:cacheprovider > $R/suite.log 2>&1; save suite $?; }
XZ_OPT=-T0 tar -cJf /tmp/fi.tar.xz .fi/.cache .fi/triton 2>/dev/null && split -b 15M /tmp/fi.tar.xz $OUT/fi.tar.xz.
cat $R/gpu.txt $R/times.txt; tail -n 6 $R/tests.log $R/suite.log 2>/dev/null
grep -h '^|' $R/kern/results.md $R/kern8/results.md 2>/dev/null | grep -v "^|--" | head -120
for f in $R/ab_*.log $R/b100_*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
