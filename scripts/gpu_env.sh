# Source on the GPU machine, from the repo root: `source scripts/gpu_env.sh`.
# Installs the carried wheels (.whl/, from ../shared/tools/gpu-wheels.sh) into /tmp/site and sets the
# environment xrt's GPU runs use. Carry [".whl", ".fi"] in the device call, or [".whl", ".whl-serve", ".fi-pack"].
# .fi-pack holds the caches compressed (the fi.tar.xz.* parts a call returned, ~10 MB against ~140 MB of .fi with
# Triton's kernels): a fresh machine unpacks them into .fi and starts with every kernel compiled, which both
# directories together could not carry.
if [ ! -d .fi ] && ls .fi-pack/fi.tar.xz.* >/dev/null 2>&1; then
  cat .fi-pack/fi.tar.xz.* | tar -xJ || return 1
fi
bash .whl/install.sh || return 1
# The serve extra (scripts/gpu_serve_wheels.sh), when carried: carry it with .whl and .fi-pack, as .fi would pass the
# limit.
if [ -d .whl-serve ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-serve/*.whl || return 1
fi
# pip has just rewritten FlashInfer's sources: backdate them (and any source FlashInfer generated into .fi)
# so ninja sees the carried .fi build as current instead of recompiling every module (~100 s per bf16 model).
# Unverified on the H200 as of this commit: check the session header of `pytest --gpu -m gpu tests` (without -q).
find /tmp/site -exec touch -h -d 2020-01-01 {} + 2>/dev/null
[ -d .fi ] && find .fi -path '*/cached_ops' -prune -o -exec touch -h -d 2020-01-01 {} + 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD FLASHINFER_WORKSPACE_BASE=$PWD/.fi PYTHONUNBUFFERED=1 XRT_CACHE_DIR=/tmp/xc
export TRITON_CACHE_DIR=$PWD/.fi/triton
