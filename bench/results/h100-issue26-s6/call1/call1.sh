# GPU call 1 (session 22). Trees: /tmp/base0 = 417de34 (before the 8B lm_head M = 2 entry), /tmp/base = 6951040
# (with it; before the Triton argmax), /tmp/am = 543da18 (the argmax), $ROOT = 7d9280c (the attention's early
# reads) + the GEMV early-weights patch, uncommitted: XRT_GEMV_EARLY_W=1 turns it on, 0 leaves the kernel as
# committed.
# 1. the breakdown's exposed time at 7d9280c (0.6B batches 1, 2, 8); 2. 0.6B batches 1/2/8: base, am, then at and
# ew alternating twice; 3. 8B batches 1/2: base0, at, ew; 4. the breakdown with early weights (0.6B 1, 2).
source scripts/gpu_env.sh || exit 1
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version,memory.total --format=csv > $R/gpu.txt
ROOT=$PWD
for b in base base0 am; do mkdir -p /tmp/$b && tar -xf ab/$b.tar -C /tmp/$b; done
cp ab/*.sh $R/
t() { name=$1; lim=$2; dir=$3; ew=$4; shift 4; s=$(date +%s)
  (cd $dir && PYTHONPATH=/tmp/site:$dir XRT_GEMV_EARLY_W=$ew XRT_GIT_COMMIT=$(case $dir in /tmp/base) echo 6951040;; /tmp/base0) echo 417de34;; /tmp/am) echo 543da18;; *) echo 7d9280c-ew$ew;; esac) timeout $lim "$@" > $R/$name.log 2>&1)
  echo "$name rc=$? $(( $(date +%s)-s )) s" >> $R/times.txt; tar -czf $OUT/r.tgz -C /tmp r; }
L="executor=cudagraph bench.peer=none bench.batch=[1,2,4,8] bench.iters=3"
E="executor=cudagraph model=qwen3-8b model.load_format=dummy bench.peer=none bench.batch=[1,2] bench.output_len=128 bench.iters=3"
B="profile.mode=breakdown executor=cudagraph profile.rows=40"
t bd-at 150 $ROOT 0 python3 -m xrt profile $B "profile.batch=[1,2,8]"
tar -czf $OUT/fi.tgz .fi
L="executor=cudagraph bench.peer=none bench.batch=[1,2,8] bench.iters=3"
t lat-base-1 60 /tmp/base 0 python3 -m xrt bench $L bench.out_dir=$R/lat-base-1
t lat-am-1 60 /tmp/am 0 python3 -m xrt bench $L bench.out_dir=$R/lat-am-1
for i in 1 2; do
  t lat-at-$i 60 $ROOT 0 python3 -m xrt bench $L bench.out_dir=$R/lat-at-$i
  t lat-ew-$i 80 $ROOT 1 python3 -m xrt bench $L bench.out_dir=$R/lat-ew-$i
done
t lat8-base0 90 /tmp/base0 0 python3 -m xrt bench $E bench.out_dir=$R/lat8-base0
t lat8-at 50 $ROOT 0 python3 -m xrt bench $E bench.out_dir=$R/lat8-at
t lat8-ew 70 $ROOT 1 python3 -m xrt bench $E bench.out_dir=$R/lat8-ew
t bd-ew 60 $ROOT 1 python3 -m xrt profile $B "profile.batch=[1,2]"
cat $R/times.txt
for f in $R/lat*.log; do echo "== $f"; grep "\[bench\] cudagraph" $f; done
for f in $R/bd*.log; do echo "== $f"; grep -E "^## batch|exposed, over" $f; done
tar -czf $OUT/r.tgz -C /tmp r
tar -czf $OUT/fi.tgz .fi
