# GPU call B (session 21): offline 0.6B batch 1, where the server's time goes on the GPU host (stamps),
# 8B gemv configs A/B (0500bdb vs 3ee6545) at batches 2 and 4, the 8B gemv kernel bench at M = 2, 4.
source scripts/gpu_env.sh || exit 1
python3 -c "import fastapi, uvicorn, uvloop, httptools, aiohttp, prometheus_client; print('serve stack ok', fastapi.__version__)"
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
lscpu | head -20 > $R/cpu.txt
ROOT=$PWD
mkdir -p /tmp/base && tar -xf ab/base.tar -C /tmp/base
cp ab/*.sh $R/
t() { name=$1; lim=$2; dir=$3; shift 3; s=$(date +%s)
  (cd $dir && PYTHONPATH=/tmp/site:$dir XRT_GIT_COMMIT=$(case $dir in /tmp/base) echo 0500bdb;; *) echo ${NEW:-3ee6545};; esac) timeout $lim "$@" > $R/$name.log 2>&1)
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
S="bench.scenario=serve executor=cudagraph bench.max_concurrency=1 bench.request_rate=[0] bench.num_requests=32"
p() { name=$1; lim=$2; shift 2; PROBE_OUT=$R/$name t $name $lim $ROOT python3 ab/probe.py bench $S bench.out_dir=$R/$name "$@"; python3 ab/an.py $R/$name >> $R/$name.log 2>&1; }
E="executor=cudagraph model=qwen3-8b model.load_format=dummy bench.peer=none bench.batch=[2,4] bench.output_len=128 bench.iters=3"
t lat8-base-1 170 /tmp/base python3 -m xrt bench $E bench.out_dir=$R/lat8-base-1
t lat8-new-1 80 $ROOT python3 -m xrt bench $E bench.out_dir=$R/lat8-new-1
t lat8-base-2 70 /tmp/base python3 -m xrt bench $E bench.out_dir=$R/lat8-base-2
t lat8-new-2 70 $ROOT python3 -m xrt bench $E bench.out_dir=$R/lat8-new-2
t gemv8 100 $ROOT python3 -m xrt bench bench.scenario=kernels "bench.kernels=[gemv]" model=qwen3-8b model.load_format=dummy "bench.batch=[2,4]" bench.out_dir=$R/gemv8
t lat-a 100 $ROOT python3 -m xrt bench executor=cudagraph bench.peer=none "bench.batch=[1]" bench.iters=3 bench.out_dir=$R/lat-a
tar -czf $OUT/fi.tgz .fi
p serve-a 80
cat $R/times.txt
for f in $R/lat*.log; do echo "== $f"; grep "\[bench\] cudagraph" $f; done
for f in serve-a serve8; do echo "== $f"; grep -E "Mean TTFT|Server's|queue|prefill \(|HTTP|Mean TPOT" $R/$f.log; tail -15 $R/$f.log; done
tar -czf $OUT/r.tgz -C /tmp r
tar -czf $OUT/fi.tgz .fi
