#!/usr/bin/env bash
# Nsight Compute details (clocks left as they are) for the kernels one deepfuse command launches:
# speed of light, launch statistics, occupancy, warp states and memory traffic, as text.
#   scripts/profile/profile-kernels.sh OUT NAME KERNEL_REGEX COUNT -- deepfuse-args...
# e.g. scripts/profile/profile-kernels.sh out attn8k decode_attention 3 -- bench attention --cases 1x8k --reps 5
# Builds build-gpu/deepfuse first when it is missing.
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NCCL NVLink multicast off: the lent multi-GPU machines need it
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/profile/profile-kernels.sh OUT NAME KERNEL_REGEX COUNT -- args...}
name=$2 kernels=$3 count=$4
shift 4
[[ ${1:-} == -- ]] && shift
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
bin=build-gpu/deepfuse
if [[ ! -x $bin ]]; then
  source scripts/device/unpack-debs.sh
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPFUSE_CUDA_ARCHS=90a "${prefix_args[@]}" >"$out/configure.log" 2>&1
  cmake --build build-gpu --target deepfuse_cli -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
fi
sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
          --section SchedulerStats --section MemoryWorkloadAnalysis ${DEEPFUSE_NCU_SECTIONS:-})
ncu --clock-control none -k "regex:$kernels" --launch-skip 4 --launch-count "$count" "${sections[@]}" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  "$bin" "$@" >"$out/ncu-$name.txt" 2>&1
echo "== $name: $(grep -c 'gpu__time_duration' "$out/ncu-$name.txt") kernels profiled"
grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|dram__throughput|Duration|Achieved Occupancy|Waves Per SM|Cluster" "$out/ncu-$name.txt" | head -n 60
