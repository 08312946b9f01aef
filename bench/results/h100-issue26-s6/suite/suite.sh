# GPU call 2 (session 22): the whole GPU suite at the final commit (XRT_GEMV_EARLY_W unset: the kernels as
# committed), then the GEMV, kernel and model tests again with the early-weights patch on, as time allows.
source scripts/gpu_env.sh || exit 1
mkdir -p /tmp/rs
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > /tmp/rs/gpu.txt
echo "$XRT_GIT_COMMIT" > /tmp/rs/commit.txt
finish() { tar -czf $OUT/r.tgz -C /tmp rs; }
trap finish EXIT
s=$(date +%s)
timeout ${SUITE_LIMIT:-540} python3 -m pytest -rfE --durations=25 --gpu -m gpu tests -p no:cacheprovider > /tmp/rs/gpu-suite.log 2>&1
echo "rc=$? $(( $(date +%s)-s )) s" >> /tmp/rs/gpu-suite.log
tail -3 /tmp/rs/gpu-suite.log
left=$(( 585 - $(date +%s) + s ))
if [ -n "$EW_TOO" ] && [ $left -gt 30 ]; then
  XRT_GEMV_EARLY_W=1 timeout $left python3 -m pytest -q -rfE --gpu -m gpu tests/kernels/test_gemv_gpu.py tests/models tests/executor -p no:cacheprovider > /tmp/rs/gpu-ew.log 2>&1
  echo "rc=$?" >> /tmp/rs/gpu-ew.log; tail -3 /tmp/rs/gpu-ew.log
fi
