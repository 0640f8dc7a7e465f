#!/usr/bin/env bash
# README "run": installs dependencies, builds, and runs the main job on the embedded default:
# trains the first-run model once (a small Llama trained on this repository's docs, cached in
# build/first-model/<hash>, scripts/first_model/) and streams text from it with `deepfuse generate`,
# then its perplexity on held-out docs with `deepfuse score`. When a GPU is present it also runs
# the SwiGLU MLP of a Llama-3-8B layer (4096x14336), naive vs unfused vs fused side by side;
# arguments go to that benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
build_dir=${DEEPFUSE_BUILD_DIR:-build}
deepfuse=./$build_dir/deepfuse

if model=$(bash scripts/first_model/build.sh); then
  echo "== the first-run model ($model, trained on this repository's docs): generate"
  "$deepfuse" generate --model "$model" --prompt "A decode step reads" --max-tokens 64
  echo "== its perplexity on held-out paragraphs of the docs: score"
  "$deepfuse" score --model "$model" --prompt "$(cat "$model/heldout.txt")" | tail -n 1
  echo "== chat with it: $deepfuse chat --model $model"
else
  # Without PyTorch (no network to PyPI) there is no trained model: the tiny random-weight model
  # still shows the binary and the tokenizer work, but its text is noise.
  echo "== the first-run model could not be built (see above); instead the tiny model, whose random weights print noise"
  rm -rf "$build_dir/tiny-model"
  "$deepfuse" make-model --out "$build_dir/tiny-model"
  "$deepfuse" generate --model "$build_dir/tiny-model" --backend reference --prompt "The capital of France is" \
    --max-tokens 32
fi

if nvidia-smi >/dev/null 2>&1; then
  echo "== SwiGLU MLP 4096x14336 on the GPU"
  "$deepfuse" bench mlp --shapes 4096x14336 --m 1,8,16,64 "$@"
else
  echo "== no GPU (nvidia-smi failed): skipping the SwiGLU MLP benchmark"
fi
