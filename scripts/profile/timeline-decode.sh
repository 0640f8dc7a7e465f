#!/usr/bin/env bash
# Where a decode step's time goes as the step really runs: Nsight Systems traces every kernel node
# of the captured step graphs (no serialisation, no cache flushes, unlike ncu), and
# scripts/profile/summarize_timeline.py sums the last few steps by kernel, with the time no kernel
# ran (launch gaps) and the time kernels overlapped (programmatic launches).
#   scripts/profile/timeline-decode.sh OUT BIN [bench decode arguments...]
# e.g. scripts/profile/timeline-decode.sh out build/deepfuse --archs llama3-8b --batches 64 --contexts 512 --tune-gemms
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${1:?usage: timeline-decode.sh OUT BIN [bench decode args]} bin=${2:?BIN}
shift 2
mkdir -p "$out"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -n1)
[[ -n $nsys ]] || { echo "timeline-decode.sh: no nsys on this machine"; exit 1; }
name=timeline
"$bin" bench decode --no-ttft "$@" --steps 16 --warmup 4 --json "$out/$name-step.json" >"$out/$name-step.txt" 2>&1
"$nsys" profile --cuda-graph-trace=node --trace=cuda --sample=none --cpuctxsw=none -f true -o "$out/$name" \
  "$bin" bench decode --no-ttft "$@" --steps 16 --warmup 4 >"$out/$name-nsys.log" 2>&1
"$nsys" stats --report cuda_gpu_trace --format csv --output "$out/$name" "$out/$name.nsys-rep" >>"$out/$name-nsys.log" 2>&1
python3 "$(dirname "$0")/summarize_timeline.py" "$out/${name}_cuda_gpu_trace.csv" "$out/$name-step.json" | tee "$out/$name.txt"
