# Run here, in the project root: puts the serve extra's wheels (with aiohttp, the serve scenario's client, and the
# official openai client and httpx, which tests/serve/test_serve_cudagraph_gpu.py needs or skips) for the GPU
# machine (Python 3.12, x86_64) into .whl-serve/, which scripts/gpu_env.sh installs there when carried. The GPU
# machine has none of them and reaches no registry; ../shared/tools/gpu-wheels.sh does not fetch them.
set -e
mkdir -p .whl-serve
python3 -m pip download -q -d .whl-serve --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  "fastapi>=0.110" "uvicorn>=0.30" "uvloop>=0.19" "httptools>=0.6" "prometheus-client>=0.20" "pydantic>=2.5" \
  "aiohttp>=3.9" "openai>=1.40" "httpx>=0.27"
du -sh .whl-serve
