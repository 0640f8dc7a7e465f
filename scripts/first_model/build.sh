#!/usr/bin/env bash
# Builds the first-run model once and prints its directory: BUILD/first-model/<hash>, where the
# hash covers scripts/first_model/train.py and its corpus (README.md, docs/design.md), so the model is
# retrained only when one of them changes. Training (about 3 minutes on 2 cores) runs in the venv
# of scripts/python-venv.sh, or with --python PY (a Python that already has torch and
# transformers, as on the GPU machines); its log goes to stderr and to DIR/train.log.
# Usage: scripts/first_model/build.sh [--python PY]    (BUILD: $DEEPFUSE_BUILD_DIR or build)
set -euo pipefail
cd "$(dirname "$0")/../.."
python=""
if [[ ${1:-} == --python ]]; then python=${2:?--python needs an interpreter}; fi
hash=$(python3 scripts/first_model/train.py --hash)
dir=${DEEPFUSE_BUILD_DIR:-build}/first-model/$hash
if [[ ! -f $dir/model.safetensors ]]; then
  if [[ -z $python ]]; then
    echo "first-model: setting up .venv-py (PyTorch and transformers from PyPI; the first time takes minutes)" >&2
    bash scripts/python-venv.sh .venv-py >&2
    python=.venv-py/bin/python
  fi
  echo "first-model: training $dir (a few minutes on 2 cores, once per change of the script or the docs)" >&2
  # Into a fresh folder renamed at the end, so an interrupted run never leaves a half model behind.
  partial="$dir.partial.$$"
  rm -rf "$partial"
  mkdir -p "$partial"
  trap 'rm -rf "$partial"' EXIT
  "$python" scripts/first_model/train.py --out "$partial" 2>&1 | tee "$partial/train.log" >&2
  rm -rf "$dir"
  mv "$partial" "$dir"
  trap - EXIT
fi
echo "$dir"
