#!/usr/bin/env bash
# README "run": installs dependencies, builds, and runs the main job on the embedded default:
# makes the tiny random-weight model (with its tokenizer) in build/tiny-model and generates text
# from a text prompt on the CPU reference backend. When a GPU is present it also runs the SwiGLU
# MLP of a Llama-3-8B layer (4096x14336), naive vs unfused vs fused side by side; arguments go to
# that benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
build_dir=${DEEPFUSE_BUILD_DIR:-build}
deepfuse=./$build_dir/deepfuse
model=$build_dir/tiny-model

echo "== tiny model (random weights, so the text is noise): make-model, then generate on the reference backend"
rm -rf "$model"  # remade every run (milliseconds), so it always matches the binary just built
"$deepfuse" make-model --out "$model"
"$deepfuse" generate --model "$model" --backend reference --prompt "The capital of France is" --max-tokens 32

if nvidia-smi >/dev/null 2>&1; then
  echo "== SwiGLU MLP 4096x14336 on the GPU"
  "$deepfuse" bench mlp --shapes 4096x14336 --m 1,8,16,64 "$@"
else
  echo "== no GPU (nvidia-smi failed): skipping the SwiGLU MLP benchmark"
fi
