#!/usr/bin/env bash
# What each kind of layer kernel adds to the decode step: `bench decode` with every kernel in the
# step, then with each kind left out (DEEPFUSE_KNOCKOUT, a diagnostic of runtime/forward.cpp whose
# outputs are wrong), then with all four left out; masks interleaved over two rounds.
#   scripts/knockouts.sh BIN OUT [bench decode arguments...]
# e.g. scripts/knockouts.sh build/deepfuse out --archs llama3.2-1b --batches 1,8 --contexts 512
# OUT/knockouts.txt: per case, ms per step for each mask and what each kernel costs per step and
# per layer (the step minus the step without it).
set -uo pipefail
bin=${1:?usage: scripts/knockouts.sh BIN OUT [bench decode args]}
out=${2:?usage: scripts/knockouts.sh BIN OUT [bench decode args]}
shift 2
mkdir -p "$out"
raw="$out/knockouts-raw.txt"
: >"$raw"
for round in 1 2; do
  for mask in 0 1 2 4 8 15; do
    DEEPFUSE_KNOCKOUT=$mask "$bin" bench decode --no-ttft "$@" 2>/dev/null |
      grep -E '^ *(llama|qwen|mistral)[^:]*  ' | awk -v m="$mask" '{print m, $1, $2, $3, $4}' >>"$raw"
  done
done
python3 - "$raw" >"$out/knockouts.txt" <<'PY'
import collections, statistics, sys
layers = {"llama3-8b": 32, "llama3.2-1b": 16, "qwen2.5-7b": 28, "mistral-7b": 32, "llama3-70b": 80}
names = {1: "QKV", 2: "attention", 4: "o_proj", 8: "MLP"}
ms = collections.defaultdict(list)
for line in open(sys.argv[1]):
    mask, arch, batch, context, step = line.split()
    ms[(arch, int(batch), int(context), int(mask))].append(float(step))
for arch, batch, context in sorted({k[:3] for k in ms}):
    median = {m: statistics.median(ms[(arch, batch, context, m)]) for m in (0, 1, 2, 4, 8, 15)
              if (arch, batch, context, m) in ms}
    if 0 not in median:
        continue
    print(f"{arch} batch {batch} context {context}: {median[0]:.3f} ms per step, "
          f"{median.get(15, float('nan')):.3f} without any layer kernel")
    for mask, name in names.items():
        if mask in median:
            cost = (median[0] - median[mask]) * 1e3
            per_layer = f", {cost / layers[arch]:.1f} per layer" if arch in layers else ""
            print(f"  {name:<10} {cost:7.1f} µs per step{per_layer}")
PY
cat "$out/knockouts.txt"
