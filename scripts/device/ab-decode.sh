#!/usr/bin/env bash
# A/B of decode plans on `deepfuse bench decode`: one process run per plan, the plans interleaved
# twice (a b c a b c) so clock or thermal drift shows up as a spread. A plan is a --plan-override
# value ("builtin" runs the built-in plan, "tuned" the tuning cache's).
#   scripts/device/ab-decode.sh OUT PLAN1 PLAN2 ... -- [bench decode arguments...]
# e.g. scripts/device/ab-decode.sh out builtin o_proj=cublaslt -- --batches 1 --contexts 512 --no-ttft
# Builds the CLI into build-gpu first (as scripts/device/gpu.sh). Summary: OUT/ab-decode.txt.
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NCCL NVLink multicast off: the lent multi-GPU machines need it
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/device/ab-decode.sh OUT PLAN1 PLAN2 ... -- [bench decode args]}
shift
plans=()
while (($#)) && [[ $1 != -- ]]; do plans+=("$1"); shift; done
[[ ${1:-} == -- ]] && shift
((${#plans[@]})) || { echo "ab-decode.sh: give at least one plan" >&2; exit 2; }
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
source scripts/device/unpack-debs.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPFUSE_CUDA_ARCHS=90a "${prefix_args[@]}" >"$out/configure.log" 2>&1
cmake --build build-gpu --target deepfuse_cli -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
summary="$out/ab-decode.txt"
: >"$summary"
for round in 1 2; do
  for plan in "${plans[@]}"; do
    case $plan in
      builtin) flags=(--no-tuning-cache) ;;
      tuned) flags=() ;;
      *) flags=(--no-tuning-cache --plan-override "$plan") ;;
    esac
    echo "== plan $plan (round $round)" | tee -a "$summary"
    build-gpu/deepfuse bench decode "${flags[@]}" "$@" 2>&1 | grep -E '^ *(llama|qwen|mistral)[^:]*  ' | tee -a "$summary"
  done
done
