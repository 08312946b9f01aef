# GPU call C (session 16): A/B 3251ae0 (fusion everywhere) against HEAD (early loads before the PDL wait in decode
# attention and qk_norm_rope; the gated epilogue on the FMA path only), and the GPU tests of the changed kernels.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R /tmp/base && tar -xf ab/base.tar -C /tmp/base
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $R/gpu.txt
ROOT=$PWD
t() { name=$1; dir=$2; commit=$3; lim=$4; shift 4; s=$(date +%s)
  (cd $dir && PYTHONPATH=/tmp/site:$dir XRT_GIT_COMMIT=$commit timeout $lim "$@") > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
L6="executor=cudagraph bench.peer=none bench.batch=[1,2] bench.iters=3"
L8="executor=cudagraph model=qwen3-8b model.load_format=dummy bench.peer=none bench.batch=[1,8] bench.output_len=128 bench.iters=3"
t lat-06b-base /tmp/base 3251ae0 90 python3 -m xrt bench $L6 bench.out_dir=$R/lat-06b-base
t lat-06b-head $ROOT $XRT_GIT_COMMIT 90 python3 -m xrt bench $L6 bench.out_dir=$R/lat-06b-head
t lat-8b-base /tmp/base 3251ae0 100 python3 -m xrt bench $L8 bench.out_dir=$R/lat-8b-base
t lat-8b-head $ROOT $XRT_GIT_COMMIT 100 python3 -m xrt bench $L8 bench.out_dir=$R/lat-8b-head
t lat-06b-base-r2 /tmp/base 3251ae0 90 python3 -m xrt bench $L6 bench.out_dir=$R/lat-06b-base-r2
t lat-06b-head-r2 $ROOT $XRT_GIT_COMMIT 90 python3 -m xrt bench $L6 bench.out_dir=$R/lat-06b-head-r2
t breakdown-06b-head $ROOT $XRT_GIT_COMMIT 60 python3 -m xrt profile profile.mode=breakdown executor=cudagraph "profile.batch=[1]"
t tests $ROOT $XRT_GIT_COMMIT 200 python3 -m pytest --gpu -q -p no:cacheprovider tests/kernels/test_decode_attention_gpu.py tests/kernels/test_kernels_gpu.py tests/executor/test_cudagraph_gpu.py tests/kernels/test_gemv_gpu.py
cat $R/times.txt; tail -3 $R/tests.log
for f in $R/lat-*/results.md; do echo "== $f"; grep "^| cudagraph" $f | cut -d'|' -f3-6; done
grep -E "^## batch" $R/breakdown-06b-head.log; grep -A14 "decode kernels" $R/breakdown-06b-head.log | grep -E "_kernel"
