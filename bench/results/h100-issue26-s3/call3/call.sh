# GPU call (session 18): A/B 0.6B (base c4ed4f6 vs head da6e2ef: M <= 4 routing; head with executor.fuse_qk_norm_rope),
# 8B batches 1-2 rope off/on, then the whole GPU suite at da6e2ef.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $R/gpu.txt
ROOT=$PWD
mkdir -p /tmp/base && tar -xf ab/base.tar -C /tmp/base
t() { name=$1; lim=$2; dir=$3; shift 3; s=$(date +%s)
  (cd $dir && PYTHONPATH=/tmp/site:$dir XRT_GIT_COMMIT=$(case $dir in /tmp/base) echo c4ed4f6;; *) echo da6e2ef;; esac) timeout $lim "$@" > $R/$name.log 2>&1)
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
L="executor=cudagraph bench.peer=none bench.batch=[1,2,3,4,8] bench.iters=3"
t lat-base-1 50 /tmp/base python3 -m xrt bench $L bench.out_dir=$R/lat-base-1
t lat-head-1 40 $ROOT python3 -m xrt bench $L bench.out_dir=$R/lat-head-1
t lat-rope-1 40 $ROOT python3 -m xrt bench $L executor.fuse_qk_norm_rope=true bench.out_dir=$R/lat-rope-1
t lat-head-2 40 $ROOT python3 -m xrt bench $L bench.out_dir=$R/lat-head-2
t lat-rope-2 40 $ROOT python3 -m xrt bench $L executor.fuse_qk_norm_rope=true bench.out_dir=$R/lat-rope-2
E="executor=cudagraph model=qwen3-8b model.load_format=dummy bench.peer=none bench.batch=[1,2] bench.output_len=128 bench.iters=3"
t lat8-head-1 55 $ROOT python3 -m xrt bench $E bench.out_dir=$R/lat8-head-1
t lat8-rope-1 45 $ROOT python3 -m xrt bench $E executor.fuse_qk_norm_rope=true bench.out_dir=$R/lat8-rope-1
left=$(( 585 - SECONDS )); echo "suite limit $left s" >> $R/times.txt
t gpu-suite $left $ROOT python3 -m pytest -rfE --durations=15 --gpu -m gpu tests
cat $R/times.txt
for f in $R/lat*.log; do echo "== $f"; grep "\[bench\] cudagraph" $f; done
tail -15 $R/gpu-suite.log
tar -czf $OUT/r.tgz -C /tmp r
