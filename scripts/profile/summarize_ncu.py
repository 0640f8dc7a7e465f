#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log by kernel and compares the total with
the step time a `deepfuse bench decode --json` file reports.
usage: scripts/profile/summarize_ncu.py NCU_CSV [STEP_JSON]"""
import csv
import io
import json
import re
import sys
from collections import defaultdict


def short_name(name):
    name = name.replace("void ", "").replace("<unnamed>::", "")
    name = re.sub(r"\(.*", "", name)  # drop the argument list, keep the template arguments
    return name.replace("deepfuse::", "").strip()


def main():
    text = open(sys.argv[1]).read()
    start = text.find('"ID"')
    if start < 0:
        sys.exit(f"no ncu rows in {sys.argv[1]}")
    totals, counts = defaultdict(float), defaultdict(int)
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(row["Metric Unit"], 1.0)
        name = short_name(row["Kernel Name"])
        totals[name] += value * scale
        counts[name] += 1
    total = sum(totals.values())
    print(f"{'kernel':60s} {'calls':>6s} {'us total':>10s} {'us/call':>9s} {'share':>6s}")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{name[:60]:60s} {counts[name]:6d} {us:10.1f} {us / counts[name]:9.2f} {100 * us / total:5.1f}%")
    print(f"{'sum of kernels':60s} {sum(counts.values()):6d} {total:10.1f}")
    if len(sys.argv) > 2:
        rows = [r for r in json.load(open(sys.argv[2]))["rows"] if r.get("kind") == "decode"]
        if rows:
            step_us = rows[0]["ms_per_step"] * 1e3
            print(f"step (bench decode, host wall time): {step_us:.1f} us; "
                  f"outside kernels (gaps, tails, host): {step_us - total:.1f} us ({100 * (step_us - total) / step_us:.1f}%)")


if __name__ == "__main__":
    main()
