#!/usr/bin/env python3
"""Per-launch timelines from `deepfuse bench decode|attention|mlp --trace FILE` (a
-DDEEPFUSE_TRACE=ON build).

usage: scripts/profile/summarize_trace.py TRACE.csv [--launches N]

Each traced kernel's blocks stamp %globaltimer at marks (kernels/common/trace.hpp): start,
upstream (programmatic dependents: the previous grid is complete), phase (the last weight or
cache page consumed; the fused MLP's phase 1), barrier (the cluster barrier after it), end, finish
(the fused MLP's and decode attention's finishing blocks). For every case this prints, per
kernel, the median over its launches (µs):

  after prev  from the previous traced launch's last block end to this launch's last block end:
              what the launch adds to the step (kernels that are not traced, such as cuBLAS's,
              fall into the gap of the next traced one)
  start       first block start, relative to the previous launch's last end (negative: blocks
              started early, as programmatic dependents)
  upstream    last block past the upstream wait, same origin
  phase       median / last block at the phase mark, same origin
  barrier     median / last block past the cluster barrier after it (the fused MLP), same origin
  end         median / last block end (finish included), same origin

and the first N launches one by one (--launches, default 8).

A grid id can stand for several launches (a CUDA graph's warm-up launch and its replay share
them): a block's events are cut into runs at each of its start marks, run k of every block making
launch k of that grid.
"""
import argparse
import collections
import csv
import statistics


def load(path):
    cases = collections.OrderedDict()
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["arch"], int(row["batch"]), int(row["context"]))
            case = cases.setdefault(key, {"step_ms": float(row["step_ms"]), "grids": collections.defaultdict(list)})
            case["grids"][row["grid"]].append(row)
    return cases


def launches_of(grids):
    """One record per launch: kernel name and the times (ns) of each mark over its blocks."""
    launches = []
    for rows in grids.values():
        kernel = next((r["kernel"] for r in rows if r["mark"] == "start"), "unknown")
        runs = collections.defaultdict(lambda: collections.defaultdict(list))  # run -> mark -> times
        for block_rows in blocks_of(rows).values():
            run = -1
            for r in sorted(block_rows, key=lambda r: int(r["time_ns"])):
                run += r["mark"] == "start"
                runs[max(run, 0)][r["mark"]].append(int(r["time_ns"]))
        for marks in runs.values():
            for times in marks.values():
                times.sort()
            done = marks["end"] + marks["finish"]
            launches.append({"kernel": kernel, "marks": marks, "first": min(marks["start"]) if marks["start"] else 0,
                             "last_end": max(done) if done else 0, "blocks": len(marks["start"])})
    launches.sort(key=lambda launch: launch["first"])
    return launches


def blocks_of(rows):
    blocks = collections.defaultdict(list)
    for r in rows:
        blocks[r["block"]].append(r)
    return blocks


def relative(times, origin, which):
    if not times:
        return None
    value = {"first": times[0], "median": times[len(times) // 2], "last": times[-1]}[which]
    return (value - origin) / 1e3


def describe(launch, origin):
    m = launch["marks"]
    done = sorted(m["end"] + m["finish"])
    return {
        "after prev": (launch["last_end"] - origin) / 1e3,
        "start": relative(m["start"], origin, "first"),
        "upstream": relative(m["upstream"], origin, "last"),
        "phase median": relative(m["phase"], origin, "median"),
        "phase last": relative(m["phase"], origin, "last"),
        "barrier median": relative(m["barrier"], origin, "median"),
        "barrier last": relative(m["barrier"], origin, "last"),
        "end median": relative(m["end"], origin, "median"),
        "end last": relative(done, origin, "last"),
    }


def fmt(value):
    return "    -  " if value is None else f"{value:7.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--launches", type=int, default=8)
    args = parser.parse_args()
    columns = ["after prev", "start", "upstream", "phase median", "phase last", "barrier median", "barrier last",
               "end median", "end last"]
    for (arch, batch, context), case in load(args.trace).items():
        launches = launches_of(case["grids"])
        if not launches:
            continue
        span = (launches[-1]["last_end"] - launches[0]["first"]) / 1e3
        print(f"\n{arch} batch {batch} context {context}: step {case['step_ms']:.3f} ms (host), "
              f"{len(launches)} traced launches over {span:.1f} µs")
        per_kernel = collections.defaultdict(list)
        rows = []
        for previous, launch in zip(launches, launches[1:]):
            d = describe(launch, previous["last_end"])
            per_kernel[launch["kernel"]].append(d)
            rows.append((launch, d))
        header = f"  {'kernel':<18}{'n':>4}" + "".join(f"{c:>16}" for c in columns)
        print("  median per launch, µs from the previous traced launch's last end")
        print(header)
        for kernel, ds in per_kernel.items():
            medians = []
            for c in columns:
                values = [d[c] for d in ds if d[c] is not None]
                medians.append(statistics.median(values) if values else None)
            print(f"  {kernel:<18}{len(ds):>4}" + "".join(f"{fmt(v):>16}" for v in medians))
        print(f"  first {args.launches} launches")
        print(header.replace("   n", "blks"))
        for launch, d in rows[: args.launches]:
            print(f"  {launch['kernel']:<18}{launch['blocks']:>4}" + "".join(f"{fmt(d[c]):>16}" for c in columns))


if __name__ == "__main__":
    main()
