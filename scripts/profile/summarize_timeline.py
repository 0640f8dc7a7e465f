#!/usr/bin/env python3
"""Sums the last steps of an `nsys stats --report cuda_gpu_trace --format csv` trace of
`deepfuse bench decode` by kernel: µs per step and per call, the time no kernel ran and the time
kernels overlapped. The step's kernel count comes from the bench's JSON (graph_kernels_per_step).
usage: scripts/profile/summarize_timeline.py TRACE_CSV STEP_JSON [STEPS]"""
import csv
import json
import re
import sys
from collections import defaultdict


def short_name(name):
    name = name.replace("void ", "").replace("(anonymous namespace)::", "").replace("deepfuse::", "")
    name = name.replace("kernels::", "")
    return re.sub(r"\(.*", "", name).strip()


def main():
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("Name") and "[CUDA mem" not in r["Name"]]
    decode = [r for r in json.load(open(sys.argv[2]))["rows"] if r.get("kind") == "decode"][0]
    per_step = decode["graph_kernels_per_step"]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    kernels = sorted(((int(r["Start (ns)"]), int(r["Duration (ns)"]), short_name(r["Name"])) for r in rows))
    # The last steps, leaving out the very last one (the bench may stop mid-replay of the next).
    window = kernels[-(steps + 1) * per_step:-per_step]
    totals, counts = defaultdict(float), defaultdict(int)
    for _, duration, name in window:
        totals[name] += duration / 1e3 / steps
        counts[name] += 1
    span = (max(s + d for s, d, _ in window) - window[0][0]) / 1e3 / steps
    busy, end = 0, None  # union of the kernels' intervals
    for start, duration, _ in window:
        stop = start + duration
        if end is None or start >= end:
            busy += duration
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    busy /= 1e3 * steps
    kernel_sum = sum(totals.values())
    print(f"{decode['arch']} batch {decode['batch']} context {decode['context']}: step {decode['ms_per_step'] * 1e3:.1f} us "
          f"(bench), traced span {span:.1f} us per step over {steps} steps, {per_step} kernels per step")
    print(f"{'kernel':64s} {'calls':>5s} {'us/step':>9s} {'us/call':>8s} {'share':>6s}")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{name[:64]:64s} {counts[name] // steps:5d} {us:9.1f} {us * steps / counts[name]:8.2f} {100 * us / span:5.1f}%")
    print(f"sum of kernel durations {kernel_sum:.1f} us; some kernel running {busy:.1f} us; "
          f"no kernel running {span - busy:.1f} us ({100 * (span - busy) / span:.1f}%); "
          f"overlap between kernels {kernel_sum - busy:.1f} us")


if __name__ == "__main__":
    main()
