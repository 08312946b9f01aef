# GPU call 2 (session 15): decode graphs up to max_num_seqs (throughput, saturation), the HTTP loop's spin on 8B.
source scripts/gpu_env.sh || exit 1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $R/gpu.txt
mkdir -p /tmp/spin && cp -r xrt conf pyproject.toml /tmp/spin/ && python3 ab/spin_patch.py /tmp/spin
ROOT=$PWD
t() { name=$1; dir=$2; shift 2; s=$(date +%s)
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 400 "$@" bench.out_dir=$R/$name) > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; }
C1="bench.scenario=serve executor=cudagraph bench.max_concurrency=1 bench.request_rate=[0] bench.num_requests=16 model=qwen3-8b model.load_format=dummy"
t offline-8b $ROOT python3 -m xrt bench executor=cudagraph bench.peer=none "bench.batch=[1]" bench.iters=3 model=qwen3-8b model.load_format=dummy
t serve-8b-head $ROOT python3 -m xrt bench $C1
t serve-8b-spin /tmp/spin python3 -m xrt bench $C1
t serve-8b-head-r2 $ROOT python3 -m xrt bench $C1
t serve-8b-spin-r2 /tmp/spin python3 -m xrt bench $C1
cat $R/times.txt
for f in $R/tp-*.log; do echo "== $f"; grep -E "throughput run|tokens/s" $f | tail -12; done
for f in $R/sat*.log $R/serve-*.log; do echo "== $f"; grep -E "Request throughput|Output token|Mean TTFT|Server's|queue \(|prefill \(|HTTP|Mean TPOT|Peak" $f; done
for f in $R/offline*.log; do echo "== $f"; grep -E "TTFT|TPOT" $f | tail -1; done
tar -czf $OUT/r.tgz -C $OUT r && rm -rf $R
