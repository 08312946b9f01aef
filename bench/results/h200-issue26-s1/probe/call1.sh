# GPU call 1 (session 15): the host's CPU, hot costs of the HTTP path, and the HTTP loop's spin prototype (A/B).
source scripts/gpu_env.sh || exit 1
R=$OUT/r; mkdir -p $R
{ nproc; lscpu | head -25; for f in scaling_governor scaling_cur_freq scaling_max_freq; do echo "$f $(cat /sys/devices/system/cpu/cpu0/cpufreq/$f 2>/dev/null)"; done
  for s in /sys/devices/system/cpu/cpu0/cpuidle/state*; do echo "$(cat $s/name 2>/dev/null) lat=$(cat $s/latency 2>/dev/null) disable=$(cat $s/disable 2>/dev/null)"; done
  python3 -c "import uvloop, httptools; print('uvloop', uvloop.__version__)"; } > $R/host.txt 2>&1
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv >> $R/host.txt
python3 ab/mb_costs.py > $R/mb_costs.txt 2>&1
python3 ab/mb_uvicorn.py uvloop > $R/mb_uvicorn.txt 2>&1
mkdir -p /tmp/stamped /tmp/spin /tmp/stamped-spin
for d in /tmp/stamped /tmp/spin /tmp/stamped-spin; do cp -r xrt conf pyproject.toml $d/; done
python3 ab/apply_stamps.py /tmp/stamped && python3 ab/apply_stamps.py /tmp/stamped-spin
python3 ab/spin_patch.py /tmp/spin && python3 ab/spin_patch.py /tmp/stamped-spin
ROOT=$PWD; C=$XRT_GIT_COMMIT
t() { name=$1; dir=$2; shift 2; s=$(date +%s)
  (cd $dir && PYTHONPATH=/tmp/site:$dir:$ROOT/ab STAMPS_DIR=$R/stamps-$name timeout 300 "$@" bench.out_dir=$R/$name) > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; }
C1="bench.scenario=serve executor=cudagraph bench.max_concurrency=1 bench.request_rate=[0] bench.num_requests=32"
t offline $ROOT python3 -m xrt bench executor=cudagraph bench.peer=none "bench.batch=[1]" bench.iters=3
t serve-head $ROOT python3 -m xrt bench $C1
t serve-spin /tmp/spin python3 -m xrt bench $C1
t serve-stamped /tmp/stamped python3 -m xrt bench $C1
t serve-stamped-spin /tmp/stamped-spin python3 -m xrt bench $C1
t serve-head-r2 $ROOT python3 -m xrt bench $C1
t serve-spin-r2 /tmp/spin python3 -m xrt bench $C1
t offline-r2 $ROOT python3 -m xrt bench executor=cudagraph bench.peer=none "bench.batch=[1]" bench.iters=3
for n in stamped stamped-spin; do python3 ab/an.py $R/stamps-serve-$n > $R/breakdown-$n.txt 2>&1; done
rm -rf $R/stamps-*
cat $R/times.txt $R/host.txt $R/mb_costs.txt $R/mb_uvicorn.txt
for f in $R/serve-*.log; do echo "== $f"; grep -E "Mean TTFT|Server's|queue \(|prefill \(|HTTP|Mean TPOT" $f; done
for f in $R/offline*.log; do echo "== $f"; grep -E "TTFT|TPOT" $f | tail -1; done
for n in stamped stamped-spin; do echo "== $n"; cat $R/breakdown-$n.txt; done
tar -czf $OUT/r.tgz -C $OUT r && rm -rf $R
