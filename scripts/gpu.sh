#!/usr/bin/env bash
# One call on a GPU machine: build with every core, GPU tests, compute-sanitizer (memcheck and
# racecheck) over the kernel tests plus memcheck over the engine end to end, parity of the cuda
# backend with Hugging Face transformers, benchmarks; logs and JSON go to the output folder.
#   scripts/gpu.sh OUT_DIR [steps...]     steps: build test sanitize parity bench (default: all)
# DEEPFUSE_BENCH_ARGS adds arguments to `deepfuse bench mlp` (e.g. --fused-tunings b1c8,b2c4),
# DEEPFUSE_DECODE_BENCH_ARGS to each `deepfuse bench decode` (e.g. --batches 1 --contexts 512).
# DEEPFUSE_PYTHON is the Python with torch and transformers for the parity step (default python3).
# Packages the machine lacks come from .debs/ (scripts/fetch-device-debs.sh, run beforehand where
# apt works), unpacked into .deps/ here: nothing is fetched from a network.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu.sh OUT_DIR [build|test|sanitize|parity|bench]...}
shift
steps=${*:-build test sanitize parity bench}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
export DEEPFUSE_BUILD_DIR=build-gpu
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
has() { [[ " $steps " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$out/gpu.txt" 2>&1
note "gpu: $(tail -n 1 "$out/gpu.txt")"
# A copied tree may carry no .git or a stale one: the caller's DEEPFUSE_COMMIT wins; CMake embeds it.
commit=${DEEPFUSE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
export DEEPFUSE_COMMIT=$commit
note "commit: $commit"

source scripts/unpack-device-debs.sh

if has build; then
  start=$SECONDS
  if bash scripts/build.sh "${prefix_args[@]}" >"$out/build.log" 2>&1; then
    note "build: ok ($((SECONDS - start)) s)"
  else
    note "build: FAILED"; tail -n 40 "$out/build.log"; exit 1
  fi
fi
bin=$DEEPFUSE_BUILD_DIR

if has test; then
  start=$SECONDS
  timeout 420 ctest --test-dir "$bin" --output-on-failure -j 4 >"$out/ctest.log" 2>&1
  note "ctest (all, incl. gpu): rc=$? ($((SECONDS - start)) s): $(grep -E 'tests passed|tests failed' "$out/ctest.log")"
  grep -E '\*\*\*Failed|Failed  |Error' "$out/ctest.log" | head -n 20 | tee -a "$summary"
fi

# The steps after the build, shared with device calls that carry prebuilt binaries.
checks=()
has sanitize && checks+=(memcheck racecheck racecheck-mlp)
has parity && checks+=(parity)
has bench && checks+=(bench)
((${#checks[@]})) && bash scripts/gpu-checks.sh "$bin" "$out" "${checks[@]}"
cat "$summary"
