set -x
source scripts/gpu_env.sh
mkdir -p /tmp/r
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > /tmp/r/gpu.txt
git log --oneline -1 > /tmp/r/commit.txt 2>/dev/null || echo "$XRT_GIT_COMMIT" > /tmp/r/commit.txt
finish() { tar -czf $OUT/r.tgz -C /tmp r; [ -d .fi/.cache ] && tar -czf $OUT/fi.tgz .fi/.cache; }
trap finish EXIT
timeout ${SUITE_LIMIT:-530} python3 -m pytest -rfE --durations=25 --gpu -m gpu tests -p no:cacheprovider > /tmp/r/gpu-suite.log 2>&1
echo "rc=$?" >> /tmp/r/gpu-suite.log
