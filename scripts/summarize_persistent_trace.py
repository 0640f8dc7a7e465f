#!/usr/bin/env python3
"""Per-layer timeline of the persistent decode kernel from `bench decode --trace` CSV (a
-DDEEPFUSE_TRACE=ON build with --persistent-decode): for each layer and mark, the earliest,
median and latest block, in µs from the kernel's first block start; and the producer's end of
each layer's weights. Then, for the first blocks with an attention item, every attention mark
of layers 1 and 2 in µs from the item's hand-off ("upstream"): "phase" after q and the new key
are rotated, "start" after each key/value stage arrives and after each tile's scores, "barrier"
when the warp's tiles are done, "finish" when the partial output is written, "end" after the
counter bump.
usage: summarize_persistent_trace.py trace.csv [context]"""
import csv
import statistics
import sys
from collections import defaultdict

ORDER = [("persistent_qkv", "upstream"), ("persistent_qkv", "phase"), ("persistent_attention", "upstream"),
         ("persistent_attention", "end"), ("persistent_o_proj", "upstream"), ("persistent_o_proj", "phase"),
         ("persistent_gate_up", "upstream"), ("persistent_gate_up", "phase"), ("persistent_down", "upstream"),
         ("persistent_down", "phase"), ("persistent_producer", "end")]

def main():
    path = sys.argv[1]
    want_context = sys.argv[2] if len(sys.argv) > 2 else None
    per_block = defaultdict(lambda: defaultdict(list))  # block -> (kernel, mark) -> [times]
    start = None
    with open(path) as f:
        for row in csv.DictReader(f):
            if not row["kernel"].startswith("persistent"):
                continue
            if want_context and row["context"] != want_context:
                continue
            t = int(row["time_ns"])
            key = (row["kernel"], row["mark"])
            if key == ("persistent_qkv", "start"):
                start = t if start is None else min(start, t)
                continue
            per_block[row["block"]][key].append(t)
    if start is None:
        sys.exit("no persistent kernel events")
    layers = max(len(v) for b in per_block.values() for v in b.values())
    print(f"{len(per_block)} blocks, {layers} layers; µs from the first block's start: min / median / max over blocks")
    header = "layer " + " ".join(f"{k.replace('persistent_', '')[:8]}.{m[:2]:>2}".rjust(20) for k, m in ORDER)
    print(header)
    for layer in range(layers):
        cells = []
        for key in ORDER:
            times = [(ts[layer] - start) / 1000 for ts in (b[key] for b in per_block.values()) if len(ts) > layer]
            if not times:
                cells.append("-".rjust(20))
                continue
            cells.append(f"{min(times):6.1f}/{statistics.median(times):6.1f}/{max(times):6.1f}".rjust(20))
        print(f"{layer:5d} " + " ".join(cells))
    attention_marks(path, want_context)

def attention_marks(path, want_context, blocks=2):
    marks = defaultdict(list)
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["kernel"] != "persistent_attention" or (want_context and row["context"] != want_context):
                continue
            marks[int(row["block"])].append((int(row["time_ns"]), row["mark"]))
    for block in sorted(marks)[:blocks]:
        layers, current = [], None
        for t, mark in sorted(marks[block]):
            if mark == "upstream" and (current is None or current[-1][1] == "end"):
                current = [(t, mark)]
                layers.append(current)
            elif current is not None:
                current.append((t, mark))
        for layer in layers[1:3]:
            t0 = layer[0][0]
            print(f"block {block}: " + " ".join(f"{m}@{(t - t0) / 1000:.2f}" for t, m in layer))


if __name__ == "__main__":
    main()
