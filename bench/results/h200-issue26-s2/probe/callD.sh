# GPU call D (session 16): the whole GPU suite at the final commit.
source scripts/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.sm,driver_version --format=csv > $OUT/gpu.txt
s=$(date +%s); timeout 540 python3 -m pytest --gpu -m gpu tests -q -p no:cacheprovider > $OUT/gpu-suite.log 2>&1
echo "gpu-suite rc=$? $(( $(date +%s)-s )) s"; tail -15 $OUT/gpu-suite.log
