#!/usr/bin/env bash
# Run HERE (where pip reaches PyPI), before a GPU run: downloads into .whl/ (git-ignored) the HTTP
# clients the serving checks compare (`openai`, `aiohttp`) with their dependencies, as CPython 3.12
# x86-64 wheels: the GPU machine has no package registry. scripts/device/serve-gpu.sh installs them
# there into a private folder; nothing is committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download openai aiohttp --dest .whl --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -q
ls -1 .whl/*.whl | wc -l | xargs echo "wheels in .whl/:"
