#!/usr/bin/env bash
# A/B of deepfuse binaries (a change against its base, built elsewhere and carried to the GPU
# machine) in one run: every round runs each binary once with the same arguments, rounds
# interleaved (a b a b), so clock or thermal drift shows up as a spread, not as a difference.
#   scripts/device/ab-binaries.sh OUT ROUNDS NAME=BINARY[,NAME=BINARY...] deepfuse-arguments...
# e.g. scripts/device/ab-binaries.sh out 2 base=bin/deepfuse-base,new=bin/deepfuse bench mlp --norm --m 1 8
# Logs: OUT/NAME-rROUND.log; OUT/ab.txt holds every log's table rows, labelled.
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # NCCL NVLink multicast off: the lent multi-GPU machines need it
out=${1:?usage: scripts/device/ab-binaries.sh OUT ROUNDS NAME=BINARY,... ARGS...}
rounds=${2:?rounds}
IFS=, read -r -a binaries <<<"${3:?NAME=BINARY list}"
shift 3
mkdir -p "$out"
summary="$out/ab.txt"
echo "== deepfuse $*" >>"$summary"
for round in $(seq 1 "$rounds"); do
  for entry in "${binaries[@]}"; do
    name=${entry%%=*}
    binary=${entry#*=}
    log="$out/$name-r$round.log"
    start=$SECONDS
    "$binary" "$@" >"$log" 2>&1
    echo "-- $name round $round: rc=$? ($((SECONDS - start)) s)" >>"$summary"
    # Table rows: lines that start with a shape (HxI) or a model preset.
    grep -E '^ *([0-9]+x[0-9]+|llama|qwen|mistral)' "$log" | sed "s/^/$name r$round | /" >>"$summary"
  done
done
