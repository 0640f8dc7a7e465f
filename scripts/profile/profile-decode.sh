#!/usr/bin/env bash
# Where a decode step's time goes: per-kernel GPU time of one captured step under Nsight Compute
# (clocks left as they are: --clock-control none), next to the step's own time from bench decode.
# The difference between the step time and the sum of its kernels is launch gaps and tails.
#   scripts/profile/profile-decode.sh OUT [--bin FILE] [arch...]   (default: llama3-8b llama3.2-1b), batch 1, context 512
# --bin FILE: a deepfuse built elsewhere (no build here).
# DEEPFUSE_PROFILE_ARGS replaces the batch and context arguments of `deepfuse bench decode`
# (e.g. "--batches 64 --contexts 512 --tune-gemms"; one batch and one context, so one step is profiled).
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NCCL NVLink multicast off: the lent multi-GPU machines need it
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/profile/profile-decode.sh OUT [arch...]}
shift
bin=
[[ ${1:-} == --bin ]] && { bin=$(realpath "$2"); shift 2; }
archs=${*:-llama3-8b llama3.2-1b}
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
source scripts/device/unpack-debs.sh
if [[ -z $bin ]]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPFUSE_CUDA_ARCHS=90a "${prefix_args[@]}" >"$out/configure.log" 2>&1
  cmake --build build-gpu --target deepfuse_cli -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
  bin=build-gpu/deepfuse
  [[ -x $bin ]] || bin=$(find build-gpu -name deepfuse -type f -perm -u+x | head -n 1)
fi
for arch in $archs; do
  args=(bench decode --archs "$arch" --no-ttft ${DEEPFUSE_PROFILE_ARGS:---batches 1 --contexts 512})
  "$bin" "${args[@]}" --json "$out/step-$arch.json" >"$out/step-$arch.txt" 2>&1
  ncu --clock-control none --profile-from-start off --graph-profiling node --metrics gpu__time_duration.sum --csv \
    "$bin" "${args[@]}" --steps 1 --warmup 2 >"$out/ncu-$arch.csv" 2>"$out/ncu-$arch.log"
  python3 scripts/profile/summarize_ncu.py "$out/ncu-$arch.csv" "$out/step-$arch.json" | tee "$out/profile-$arch.txt"
done
