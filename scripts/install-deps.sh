#!/usr/bin/env bash
# Installs, idempotently, the Debian packages deepfuse builds and tests with.
# The CUDA toolkit (nvcc, cuBLASLt, NCCL) is expected to be present already.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev python3 python3-venv curl
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all packages present"
fi

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: nvcc not found; install the CUDA toolkit (13.x) first" >&2
  exit 1
fi

# --- Python package (issue 42): scripts/test-python.sh makes a venv with `python3 -m venv`, which on
# Debian's own python3 needs python3-venv (ensurepip). PyTorch itself comes from PyPI in that script.
if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
  echo "install-deps: installing python3-venv"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends python3-venv
fi

# --- xgrammar (structured output, docs/server.md): Debian does not package it; its C++ core is built
# from its PyPI source distribution into .xgrammar/install (git-ignored), once per version.
bash "$(dirname "$0")/deps/xgrammar.sh"
