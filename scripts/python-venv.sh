#!/usr/bin/env bash
# The one Python environment of the scripts: makes the virtual environment VENV (default .venv-py)
# when missing and installs PyTorch, transformers and pytest into it from PyPI. Used by
# scripts/test-python.sh (the package's tests) and scripts/first_model/build.sh (the first-run
# model's training); prints nothing but pip's errors, so callers can time and label the step.
# Usage: scripts/python-venv.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-py}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"  # python3-venv: scripts/install-deps.sh
# PyTorch from PyPI (its Linux wheels bring the CUDA libraries: about 5.4 GB installed);
# transformers for the CPU test that compiles patched Hugging Face models on the meta device and
# for the first-run model (training, tokenizer, parity).
"$venv/bin/python" -m pip install -q --disable-pip-version-check torch pytest transformers
