#!/usr/bin/env bash
# Tuned against built-in decode plans on this GPU, in one run: builds the CLI (unless BIN is given),
# runs `deepfuse tune` for each model into OUT/tuning.json, then `deepfuse bench decode` under the
# built-in plan and under the tuned one, interleaved ROUNDS times (a b a b) so drift shows up as a
# spread. JSON and logs in OUT; OUT/summary.txt holds the tune times and the decode rows.
#   scripts/device/plan-ab.sh OUT ROUNDS ARCHS [bench decode arguments...]
# e.g. scripts/device/plan-ab.sh out 1 llama3-8b,llama3.2-1b --batches 1,8,16,32,64 --no-ttft
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NCCL NVLink multicast off: the lent multi-GPU machines need it
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/device/plan-ab.sh OUT ROUNDS ARCHS [bench decode args]}
rounds=${2:?rounds}
IFS=, read -r -a archs <<<"${3:?archs}"
shift 3
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=${BIN:-build-gpu/deepfuse}
if [[ -z ${BIN:-} ]]; then
  DEEPFUSE_CMAKE_ARGS=${DEEPFUSE_CMAKE_ARGS:--DDEEPFUSE_CUDA_ARCHS=90a} bash scripts/device/gpu.sh "$out/build" build \
    >"$out/build.log" 2>&1 || { tail -n 20 "$out/build.log"; exit 1; }
fi
summary="$out/summary.txt"
: >"$summary"
cache="$out/tuning.json"
for arch in "${archs[@]}"; do
  start=$SECONDS
  "$bin" tune --random-weights --arch "$arch" --max-batch 64 --max-context 32816 --tuning-cache "$cache" \
    --json "$out/tune-$arch.json" >"$out/tune-$arch.txt" 2>&1
  echo "tune $arch: rc=$? $((SECONDS - start)) s" | tee -a "$summary"
done
for round in $(seq 1 "$rounds"); do
  for plan in builtin tuned; do
    flags=(--no-tuning-cache)
    [[ $plan == tuned ]] && flags=(--tuning-cache "$cache")
    for arch in "${archs[@]}"; do
      log="$out/decode-$plan-$arch-r$round"
      "$bin" bench decode --archs "$arch" "${flags[@]}" --json "$log.json" "$@" >"$log.txt" 2>&1
      echo "== $plan $arch round $round: rc=$?" >>"$summary"
      grep -E '^ *(llama|qwen|mistral)[^:]*  ' "$log.txt" | sed "s/^/$plan r$round | /" >>"$summary"
    done
  done
done
cat "$summary"
