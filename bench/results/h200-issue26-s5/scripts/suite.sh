set -x
source scripts/gpu_env.sh
mkdir -p /tmp/rs
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > /tmp/rs/gpu.txt
git log --oneline -1 > /tmp/rs/commit.txt 2>/dev/null || echo "$XRT_GIT_COMMIT" > /tmp/rs/commit.txt
finish() { tar -czf $OUT/r.tgz -C /tmp rs; [ -d .fi/.cache ] && tar -czf $OUT/fi.tgz .fi/.cache; }
trap finish EXIT
timeout ${SUITE_LIMIT:-560} python3 -m pytest -rfE --durations=25 --gpu -m gpu tests -p no:cacheprovider > /tmp/rs/gpu-suite.log 2>&1
echo "rc=$?" >> /tmp/rs/gpu-suite.log
