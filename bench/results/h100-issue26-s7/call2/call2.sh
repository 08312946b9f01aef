# GPU call 2 (session 25): prefill attention kernels microbench; fa2 vs auto(fa3) end to end (profile step, bench b1/b8).
source scripts/gpu_env.sh || exit 1
R=/tmp/r2; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
s=$(date +%s)
save() { echo "$1 rc=$2 $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r2.tgz -C /tmp r2; }
timeout 240 python3 ab/attn.py > $R/attn.log 2>&1; save attn $?
tar -czf $OUT/fi.tgz .fi; save fi 0
export XRT_GIT_COMMIT=b562327
P="python3 -m xrt profile profile.mode=step executor=cudagraph profile.batch=[1] profile.rows=0"
B="python3 -m xrt bench executor=cudagraph bench.peer=none bench.batch=[1,8] bench.iters=3"
timeout 120 $P executor.prefill_attention=fa2 > $R/step_fa2.log 2>&1; save step_fa2 $?
timeout 100 $P > $R/step_auto.log 2>&1; save step_auto $?
timeout 100 $B executor.prefill_attention=fa2 bench.out_dir=$R/lat_fa2a > $R/lat_fa2a.log 2>&1; save lat_fa2a $?
timeout 100 $B bench.out_dir=$R/lat_auto_a > $R/lat_auto_a.log 2>&1; save lat_auto_a $?
tar -czf $OUT/fi.tgz .fi; save end 0
cat $R/gpu.txt $R/times.txt; grep -v Warn $R/attn.log | tail -22; grep -h "\[bench\] cudagraph" $R/lat_*.log
for f in $R/step_*.log; do echo "== $f"; grep -A20 "part by part" $f | grep -E "graph|idle|start to end"; done
