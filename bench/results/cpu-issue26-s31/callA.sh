# Session 31's first GPU call (carrying [".whl", ".fi", ".whl-serve"]): (1) the GPU tests of the decode attention, its backend,
# the CUDA-graph executor and e2e at HEAD; (2) bench/results/cpu-issue26-s31/early_kv.patch (the decode attention's first K/V block loaded right
# after its PDL wait, ahead of q) A/B against HEAD, alternating, patch first; (3) those GPU tests with the patch;
# (4) one pair of executor.fuse_qk_norm_rope=false at batches 4 / 8: HEAD (Triton unfused) vs bench/results/cpu-issue26-s31/unfused_b2.patch.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R; s=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
left() { echo $(( ${END_S:-560} - ($(date +%s)-s) )); }
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
base() { git checkout -q -- xrt/kernels/decode_attention.py xrt/attention/flashinfer.py; }
T="tests/kernels/test_decode_attention_gpu.py tests/attention/test_attention_flashinfer_gpu.py tests/executor/test_cudagraph_gpu.py tests/e2e/test_e2e_gpu.py"
timeout 300 python3 -m pytest -q -rfE --gpu -m gpu $T -p no:cacheprovider > $R/suite.log 2>&1; save suite $?
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.iters=3"
for i in a b; do
  [ $(left) -gt 200 ] || break
  base; git apply bench/results/cpu-issue26-s31/early_kv.patch || exit 1
  timeout 150 $B "bench.batch=[1,2,4,8]" bench.out_dir=$R/lat_kv_$i > $R/lat_kv_$i.log 2>&1; save kv_$i $?
  base; timeout 150 $B "bench.batch=[1,2,4,8]" bench.out_dir=$R/lat_base_$i > $R/lat_base_$i.log 2>&1; save base_$i $?
done
base; git apply bench/results/cpu-issue26-s31/early_kv.patch
[ $(left) -gt 60 ] && { timeout $(( $(left) - 10 )) python3 -m pytest -q -rfE --gpu -m gpu $T -p no:cacheprovider \
  > $R/suite-kv.log 2>&1; save suite-kv $?; }
U="$B executor.fuse_qk_norm_rope=false bench.batch=[4,8]"
base; [ $(left) -gt 130 ] && { timeout 60 $U bench.out_dir=$R/unf_head > $R/unf_head.log 2>&1; save unf_head $?
  git apply bench/results/cpu-issue26-s31/unfused_b2.patch; timeout 60 $U bench.out_dir=$R/unf_b2 > $R/unf_b2.log 2>&1; save unf_b2 $?; }
base; cat $R/gpu.txt $R/times.txt; tail -n 2 $R/suite.log $R/suite-kv.log
# The FlashInfer and Triton caches, in parts under the 16 MiB a returned file may hold (one tarball was over it):
# here, `cat <files_at>/fi.tgz.part-* | tar -xzf -` in the repository root restores .fi for the next session's call
# (carry it when `du -shc .whl .whl-serve .fi` stays under 64 MiB; the backdating in scripts/gpu_env.sh keeps it).
tar -czf - .fi | split -b 15m -a 1 - $OUT/fi.tgz.part-; ls -l $OUT
for f in $R/*.log; do echo "$f $(grep -h '\[bench\] cudagraph' $f | tr '\n' ' ')"; done
