# GPU call A (session 16): bench.peer=both on the GPU; 0.6B and 8B decode breakdowns at HEAD; issue 24's prepared
# probes (HTTP loop polling 10 ms past the last request, A/B alternating; a bare uvicorn + aiohttp pair).
source scripts/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $OUT/gpu.txt
mkdir -p /tmp/head /tmp/spin2 && tar -xf ab/head.tar -C /tmp/head && tar -xf ab/head.tar -C /tmp/spin2
python3 ab/spin2_patch.py /tmp/spin2 || exit 1
C=$XRT_GIT_COMMIT
t() { name=$1; dir=$2; lim=$3; shift 3; s=$(date +%s)
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout $lim "$@") > $OUT/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $OUT/times.txt; }
C1="bench.scenario=serve executor=cudagraph bench.max_concurrency=1 bench.request_rate=[0] bench.num_requests=32"
t serve-head /tmp/head 90 python3 -m xrt bench $C1 bench.out_dir=/tmp/o/serve-head
t serve-spin2 /tmp/spin2 90 python3 -m xrt bench $C1 bench.out_dir=/tmp/o/serve-spin2
t serve-head-r2 /tmp/head 90 python3 -m xrt bench $C1 bench.out_dir=/tmp/o/serve-head-r2
t serve-spin2-r2 /tmp/spin2 90 python3 -m xrt bench $C1 bench.out_dir=/tmp/o/serve-spin2-r2
(cd /tmp/head && PYTHONPATH=/tmp/site:/tmp/head python3 $OLDPWD/ab/mb_arrival_srv.py > $OUT/mb_arrival_srv.log 2>&1 &)
sleep 4; python3 ab/mb_arrival_cli.py > $OUT/mb_arrival.txt 2>&1; pkill -f mb_arrival_srv.py
t breakdown-06b /tmp/head 120 python3 -m xrt profile profile.mode=breakdown executor=cudagraph "profile.batch=[1,8]"
t breakdown-8b /tmp/head 150 python3 -m xrt profile profile.mode=breakdown executor=cudagraph model=qwen3-8b model.load_format=dummy "profile.batch=[1]"
t peer-both /tmp/head 220 python3 -m xrt bench executor=cudagraph bench.peer=both "bench.batch=[1]" bench.output_len=64 bench.iters=1 bench.out_dir=/tmp/o/peer-both
cp /tmp/o/peer-both/*.md /tmp/o/peer-both/*.png /tmp/o/peer-both/*.json* $OUT/ 2>/dev/null
cat $OUT/times.txt
for f in $OUT/serve-*.log; do echo "== $f"; grep -E "Mean TTFT|Server's|HTTP|Mean TPOT" $f; done
cat $OUT/mb_arrival.txt
