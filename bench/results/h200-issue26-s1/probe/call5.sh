# GPU call 4 (session 15, the last): 8B decode A/B (75ce205 against this commit: the 8B GEMV configs), the whole GPU
# suite at this commit. Logs straight into $OUT.
source scripts/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $OUT/gpu.txt
mkdir -p /tmp/base && tar -xf ab/base-75ce205.tar -C /tmp/base
ROOT=$PWD
t() { name=$1; dir=$2; commit=$3; lim=$4; shift 4; s=$(date +%s)
  (cd $dir && PYTHONPATH=/tmp/site:$dir XRT_GIT_COMMIT=$commit timeout $lim "$@") > $OUT/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $OUT/times.txt; }
L8="executor=cudagraph model=qwen3-8b model.load_format=dummy bench.peer=none bench.batch=[1,8] bench.output_len=128 bench.iters=3"
t lat-8b-75ce205 /tmp/base 75ce205 90 python3 -m xrt bench $L8 bench.out_dir=$OUT/lat-8b-75ce205
t lat-8b-head $ROOT $XRT_GIT_COMMIT 90 python3 -m xrt bench $L8 bench.out_dir=$OUT/lat-8b-head
grep -h "\[bench\] cudagraph" $OUT/lat-8b-*.log
t gpu-suite $ROOT $XRT_GIT_COMMIT 370 python3 -m pytest --gpu -m gpu tests -q -p no:cacheprovider
tail -5 $OUT/gpu-suite.log
cat $OUT/times.txt
