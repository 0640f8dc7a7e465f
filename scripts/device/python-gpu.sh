#!/usr/bin/env bash
# The Python package's GPU checks on a GPU machine with PyTorch, transformers, scikit-build-core and
# nvcc already installed (no network): builds `pip install --no-build-isolation .` (sm_90a), runs
# python/tests (GPU tests included) and `python -m deepfuse.bench`. Logs and bench.json go to OUT_DIR.
# Usage: scripts/device/python-gpu.sh OUT_DIR [COMMIT] [SECONDS]   (SECONDS: whole-script budget, default 515)
set -uo pipefail
out=${1:?usage: python-gpu.sh OUT_DIR [COMMIT] [SECONDS]}
commit=${2:-unknown}
budget=${3:-515}
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
s=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -q . -C cmake.define.DEEPFUSE_CUDA_ARCHS=90a \
  -C build-dir=/tmp/deepfuse-python-build > "$out/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - s )) s"
tail -5 "$out/build.log"
s=$(date +%s)
timeout 150 python3 -m pytest python/tests -q -rs -p no:cacheprovider --durations=6 2>&1 | tee "$out/pytest.log" | grep -v '^  ' | tail -45
echo "pytest $(( $(date +%s) - s )) s"
s=$(date +%s)
left=$(( budget - s + t0 ))
echo "bench gets $left s"
timeout "$left" python3 -m deepfuse.bench --json "$out/bench.json" --commit "$commit" --steps 32 > "$out/bench.txt" 2>&1
echo "bench rc=$? $(( $(date +%s) - s )) s"
grep -E '^(mlp|hf|NVIDIA)|Error|error' "$out/bench.txt" | tail -40
