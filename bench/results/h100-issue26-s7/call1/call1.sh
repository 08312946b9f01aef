# GPU call 1 (session 25): small H2D copy latency on this machine; profile step head0/head2; bench b1/b8 head0 vs head2.
source scripts/gpu_env.sh || exit 1
R=/tmp/r1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
nvidia-smi -q > $R/smi.txt 2>&1
probe() { python3 -c "
import time; t=time.perf_counter(); s=0
for i in range(1000000): s+=i
print('python loop of 1e6 adds: %.1f ms' % ((time.perf_counter()-t)*1e3))"; }
probe > $R/host.txt
s=$(date +%s)
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r1.tgz -C /tmp r1; }
timeout 120 python3 ab/h2d.py > $R/h2d.log 2>&1; save h2d $?
P="python3 -m xrt profile profile.mode=step executor=cudagraph profile.batch=[1] profile.rows=0"
timeout 240 $P executor.prefill_graph_head_layers=0 > $R/step06_h0.log 2>&1; save step06_h0 $?
tar -czf $OUT/fi.tgz .fi; save fi 0
timeout 100 $P executor.prefill_graph_head_layers=2 > $R/step06_h2.log 2>&1; save step06_h2 $?
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.batch=[1,8] bench.iters=3"
export XRT_GIT_COMMIT=adac371
timeout 100 $B executor.prefill_graph_head_layers=0 bench.out_dir=$R/lat_h0a > $R/lat_h0a.log 2>&1; save lat_h0a $?
timeout 100 $B executor.prefill_graph_head_layers=2 bench.out_dir=$R/lat_h2a > $R/lat_h2a.log 2>&1; save lat_h2a $?
timeout 100 $B executor.prefill_graph_head_layers=0 bench.out_dir=$R/lat_h0b > $R/lat_h0b.log 2>&1; save lat_h0b $?
timeout 100 $B executor.prefill_graph_head_layers=2 bench.out_dir=$R/lat_h2b > $R/lat_h2b.log 2>&1; save lat_h2b $?
probe >> $R/host.txt; save end 0
cat $R/gpu.txt $R/times.txt $R/host.txt $R/h2d.log; grep -h "\[bench\] cudagraph" $R/lat_*.log
for f in $R/step06_h*.log; do echo "== $f"; grep -A20 "part by part" $f; done
