#!/usr/bin/env bash
# The Python package's tests (issue 42), called by scripts/test.sh after the C++ tests.
# Makes a virtual environment (.venv-py, or the folder given as $1), installs PyTorch and pytest
# from PyPI into it, builds and installs the package (`pip install .`: scikit-build-core drives
# python/CMakeLists.txt, nvcc compiles the kernels), then runs python/tests. Without a GPU the GPU
# tests skip with a reason and the rest (import, schemas, fake implementations) run.
# Options through the environment of this script (the package itself reads none):
#   DEEPFUSE_PY_ARCHS  CUDA targets of the package's build (default 90a, one target to keep CI short;
#                      pip install . alone builds "90a;80", as the C++ build does)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-py}
archs=${DEEPFUSE_PY_ARCHS:-90a}
export PATH=/usr/local/cuda/bin:$PATH

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"  # python3-venv: scripts/install-deps.sh
py="$venv/bin/python"
start=$(date +%s)
# PyTorch from PyPI (its Linux wheels bring the CUDA libraries: about 5.4 GB installed); transformers
# for the CPU test that compiles patched Hugging Face models on the meta device.
"$py" -m pip install -q --disable-pip-version-check torch pytest transformers
echo "test-python: torch, pytest and transformers present after $(( $(date +%s) - start )) s"
"$py" -m pip install -q --disable-pip-version-check . -C "cmake.define.DEEPFUSE_CUDA_ARCHS=$archs"
echo "test-python: deepfuse built and installed after $(( $(date +%s) - start )) s"
# From python/tests, so `import deepfuse` is the installed package, not the source folder.
"$py" -m pytest python/tests -q -rs -p no:cacheprovider
echo "test-python: done after $(( $(date +%s) - start )) s"
