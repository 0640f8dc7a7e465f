#!/usr/bin/env bash
# The Python package's tests (issue 42), called by scripts/test.sh after the C++ tests.
# Makes a virtual environment (.venv-py, or the folder given as $1) with PyTorch, transformers and
# pytest from PyPI (scripts/python-venv.sh), builds and installs the package (`pip install .`:
# scikit-build-core drives python/CMakeLists.txt, nvcc compiles the kernels), builds the first-run
# model (scripts/first_model/build.sh), then runs python/tests. Without a GPU the GPU tests skip
# with a reason and the rest (import, schemas, fake implementations, the first-run model's parity
# with transformers on the reference backend, given build/deepfuse) run.
# Options through the environment of this script (the package itself reads none):
#   DEEPFUSE_PY_ARCHS  CUDA targets of the package's build (default 90a, one target to keep CI short;
#                      pip install . alone builds "90a;80", as the C++ build does)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-py}
archs=${DEEPFUSE_PY_ARCHS:-90a}
export PATH=/usr/local/cuda/bin:$PATH

py="$venv/bin/python"
start=$(date +%s)
bash scripts/python-venv.sh "$venv"
echo "test-python: torch, pytest and transformers present after $(( $(date +%s) - start )) s"
"$py" -m pip install -q --disable-pip-version-check . -C "cmake.define.DEEPFUSE_CUDA_ARCHS=$archs"
echo "test-python: deepfuse built and installed after $(( $(date +%s) - start )) s"
# The first-run model (trained once per change of scripts/first_model/train.py or the docs, about 3
# minutes on 2 cores) and the deepfuse binary for test_first_model.py's parity with transformers.
DEEPFUSE_FIRST_MODEL=$(realpath "$(bash scripts/first_model/build.sh --python "$py")")
export DEEPFUSE_FIRST_MODEL
echo "test-python: first-run model $DEEPFUSE_FIRST_MODEL ready after $(( $(date +%s) - start )) s"
cli=${DEEPFUSE_BUILD_DIR:-build}/deepfuse
if [[ -z ${DEEPFUSE_CLI:-} && -x $cli ]]; then
  DEEPFUSE_CLI=$(realpath "$cli")
  export DEEPFUSE_CLI
fi
# From python/tests, so `import deepfuse` is the installed package, not the source folder.
"$py" -m pytest python/tests -q -rs -p no:cacheprovider
echo "test-python: done after $(( $(date +%s) - start )) s"
