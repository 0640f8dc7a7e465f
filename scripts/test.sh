#!/usr/bin/env bash
# README "pass the tests": installs dependencies, builds, runs every test (GPU tests skip
# themselves without a device).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
ctest --test-dir "${DEEPFUSE_BUILD_DIR:-build}" --output-on-failure --timeout 1500 -j "$(nproc)"

# --- Python package (issue 42) -------------------------------------------------------------------
# Builds `pip install .` into .venv-py (PyTorch from PyPI) and runs its pytest suite; GPU tests skip
# without a device. Kept apart from the C++ build and tests above.
bash scripts/test-python.sh
