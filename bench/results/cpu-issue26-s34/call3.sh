# The whole GPU suite at the tree as it is (carrying [".whl", ".whl-serve"]): after call2 has decided what lands,
# `XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s34/call3.sh` on the warm machine. Log in $OUT/suite.log.
source scripts/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
set -o pipefail
timeout 570 python3 -m pytest --gpu -m gpu tests -q -p no:cacheprovider 2>&1 | tee $OUT/suite.log | tail -n 15
