# Session 37's first call, carrying [".whl", ".whl-serve", ".fi-pack"]: on an H200 it runs issue 24's check
# (bench/results/cpu-issue24-s34/call.sh, results in $OUT/r.tgz), on any other card the prefill-epilogue
# measurements (bench/results/cpu-issue26-s37/call.sh, $OUT/r9.tgz). The second call runs the other one where the
# card allows. `END_S=570 XRT_GIT_COMMIT=<sha> bash bench/results/cpu-issue26-s37/first.sh`.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash bench/results/cpu-issue24-s34/call.sh
else
  bash bench/results/cpu-issue26-s37/call.sh
fi
