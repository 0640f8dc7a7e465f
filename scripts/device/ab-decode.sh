#!/usr/bin/env bash
# A/B of an environment switch on `deepfuse bench decode`, in one process run per value, the
# values interleaved twice (a b c a b c) so clock or thermal drift shows up as a spread.
#   scripts/device/ab-decode.sh OUT VAR v1,v2,... [bench decode arguments...]
# e.g. scripts/device/ab-decode.sh out DEEPFUSE_PDL 0,1 --batches 1 --contexts 512 --no-ttft
# Builds the CLI into build-gpu first (as scripts/device/gpu.sh). Summary: OUT/ab-VAR.txt.
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NCCL NVLink multicast off: the lent multi-GPU machines need it
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/device/ab-decode.sh OUT VAR v1,v2,... [bench decode args]}
var=${2:?variable}
IFS=, read -r -a values <<<"${3:?values}"
shift 3
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
source scripts/device/unpack-debs.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPFUSE_CUDA_ARCHS=90a "${prefix_args[@]}" >"$out/configure.log" 2>&1
cmake --build build-gpu --target deepfuse_cli -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
summary="$out/ab-$var.txt"
: >"$summary"
for round in 1 2; do
  for v in "${values[@]}"; do
    echo "== $var=$v (round $round)" | tee -a "$summary"
    env "$var=$v" build-gpu/deepfuse bench decode "$@" 2>&1 | grep -E '^ *(llama|qwen|mistral)[^:]*  ' | tee -a "$summary"
  done
done
