# GPU call 1 (session 18): fuse_norm GPU tests and A/B (0.6B batches 1,2,4,8; 8B batch 1), gemv kernel bench at M=1..4.
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $R/gpu.txt
ROOT=$PWD
export XRT_GIT_COMMIT=f80e7c8
t() { name=$1; lim=$2; shift 2; s=$(date +%s)
  timeout $lim "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
L="executor=cudagraph bench.peer=none bench.batch=[1,2,4,8] bench.iters=3"
t lat-off-1 150 python3 -m xrt bench $L executor.fuse_norm=false bench.out_dir=$R/lat-off-1
tar -czf $OUT/fi.tgz .fi/.cache 2>/dev/null
t gputest-norm 120 python3 -m pytest --gpu -q -x tests/kernels/test_gemv_gpu.py tests/kernels/test_kernels_gpu.py -k "norm or add_rms_norm_linear"
t lat-on-1 80 python3 -m xrt bench $L executor.fuse_norm=true bench.out_dir=$R/lat-on-1
t lat-off-2 80 python3 -m xrt bench $L executor.fuse_norm=false bench.out_dir=$R/lat-off-2
t lat-on-2 80 python3 -m xrt bench $L executor.fuse_norm=true bench.out_dir=$R/lat-on-2
E="executor=cudagraph model=qwen3-8b model.load_format=dummy bench.peer=none bench.batch=[1] bench.output_len=128 bench.iters=3"
t lat8-off-1 90 python3 -m xrt bench $E executor.fuse_norm=false bench.out_dir=$R/lat8-off-1
t lat8-on-1 90 python3 -m xrt bench $E executor.fuse_norm=true bench.out_dir=$R/lat8-on-1
t gemv-m1234 100 python3 -m xrt bench bench.scenario=kernels "bench.kernels=[gemv]" "bench.batch=[1,2,3,4]" bench.out_dir=$R/gemv-m1234
cat $R/times.txt
grep -h "\[bench\] cudagraph" $R/lat*.log
tail -3 $R/gputest-norm.log
du -sh .fi/* 
tar -czf $OUT/r.tgz -C /tmp r
