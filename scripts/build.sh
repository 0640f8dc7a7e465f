#!/usr/bin/env bash
# Configures and builds deepfuse into build/ (or $DEEPFUSE_BUILD_DIR) with every core.
# Extra arguments go to CMake's configure step (e.g. -DDEEPFUSE_CUDA_ARCHS=90a).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${DEEPFUSE_BUILD_DIR:-build}
export PATH=/usr/local/cuda/bin:$PATH
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
