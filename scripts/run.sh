#!/usr/bin/env bash
# README "run": installs dependencies, builds, and runs the main job on the best device: the
# SwiGLU MLP of a Llama-3-8B layer (4096x14336), GPU variants side by side when a GPU is
# present, the CPU reference backend otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
if ./build/deepfuse bench mlp --shapes 4096x14336 --m 1 --reps 1 --variants fused >/dev/null 2>&1 &&
   nvidia-smi >/dev/null 2>&1; then
  ./build/deepfuse bench mlp --shapes 4096x14336 --m 1,8,16,64 "$@"
else
  ./build/deepfuse bench mlp --shapes 4096x14336 --m 1,8 --reps 1 "$@"
fi
