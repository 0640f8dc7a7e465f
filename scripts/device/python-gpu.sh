#!/usr/bin/env bash
# The Python package's GPU checks on a GPU machine with PyTorch, transformers, scikit-build-core and
# nvcc already installed (no network): builds `pip install --no-build-isolation .` (sm_90a), then
#   check (default): runs python/tests (GPU tests included) and `python -m deepfuse.bench` at batches
#                    1 and 8 (bench.json, bench.txt);
#   sweep:           only the benchmark's hf suite: torch.compile'd Llama-3-8B stock against
#                    deepfuse.patch at BATCHES (default 1,2,4,8,16,32,64; each batch compiles both
#                    models, 32-39 s each on the H100 in bench/results/h100/python-bb9d1a85375b.txt,
#                    so split the batches over two calls of 10 minutes), alternating rounds
#                    (patch-sweep.json, patch-sweep.txt; rows are saved as each batch finishes, so a
#                    run cut short keeps the batches it measured).
# Logs and results go to OUT_DIR.
# Usage: scripts/device/python-gpu.sh OUT_DIR [COMMIT] [SECONDS] [check|sweep] [BATCHES]
#   (SECONDS: whole-script budget, default 515)
set -uo pipefail
out=${1:?usage: python-gpu.sh OUT_DIR [COMMIT] [SECONDS] [check|sweep] [BATCHES]}
commit=${2:-unknown}
budget=${3:-515}
mode=${4:-check}
batches=${5:-1,2,4,8,16,32,64}
case $mode in check|sweep) ;; *) echo "python-gpu.sh: mode must be check or sweep, not '$mode'" >&2; exit 2 ;; esac
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
if [ "$mode" = check ]; then
  s=$(date +%s)
  timeout 150 python3 -m pytest python/tests -q -rs -p no:cacheprovider --durations=6 2>&1 | tee "$out/pytest.log" | grep -v '^  ' | tail -45
  echo "pytest $(( $(date +%s) - s )) s"
  name=bench bench_args=(--batches 1,8 --rounds 2)
else
  name=patch-sweep bench_args=(--suite hf --batches "$batches" --rounds 4)
fi
s=$(date +%s)
left=$(( budget - s + t0 ))
echo "bench gets $left s"
timeout "$left" python3 -m deepfuse.bench --json "$out/$name.json" --commit "$commit" "${bench_args[@]}" > "$out/$name.txt" 2>&1
echo "bench rc=$? $(( $(date +%s) - s )) s"
grep -E '^(mlp|hf|NVIDIA|  M=)|Error|error' "$out/$name.txt" | tail -40
