#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel (tools/gpu/profile.sh).

Forward passes are counted by the embedding kernel (one per Model::run); with --wall (a
`quantspec bench -o` JSON of the same mode) the GPU time per forward is set against the measured
wall time per step, the difference being host time (launches, synchronisation, sampling).

    python3 tools/gpu/ncu_summary.py ncu-decode-quantspec.csv --wall wall-quantspec.json
"""
import argparse
import csv
import io
import json
import re
import sys
from collections import defaultdict

_UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
            "second": 1e6, "s": 1e6}


def short_name(name):
    """`void ns::kernel<128, true>(Args)` -> `kernel<128, true>`."""
    name = name.strip()
    if name.endswith(")"):  # the parameter list: back to its matching parenthesis
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"^(void|auto)\s+", "", name)
    base, _, targs = name.partition("<")
    base = base.split("::")[-1]
    return base + ("<" + targs if targs else "")


def read_rows(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    start = text.find('"ID"')  # ncu may print ==PROF== lines before the table
    if start < 0:
        return []
    return list(csv.DictReader(io.StringIO(text[start:])))


def summarize(rows):
    """Per kernel [launches, us]; the number of forwards; GPU us of each forward by kind ("draft":
    it ran a 4-bit GEMV, else "target"), kernels before the first forward not counted there."""
    per_kernel = defaultdict(lambda: [0, 0.0])
    forwards = 0
    by_kind = defaultdict(list)
    current = None  # [us, is_draft]
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(row["Metric Value"].replace(",", "")) * _UNIT_US.get(row.get("Metric Unit", "ns"),
                                                                        1e-3)
        name = short_name(row["Kernel Name"])
        per_kernel[name][0] += 1
        per_kernel[name][1] += us
        if name.startswith("embedding_kernel"):
            forwards += 1
            if current:
                by_kind["draft" if current[1] else "target"].append(current[0])
            current = [0.0, False]
        if current:
            current[0] += us
            current[1] |= "q4" in name
    if current:
        by_kind["draft" if current[1] else "target"].append(current[0])
    return per_kernel, forwards, by_kind


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--wall", help="quantspec bench JSON of the same mode (wall ms per step)")
    args = ap.parse_args()
    per_kernel, forwards, by_kind = summarize(read_rows(args.csv))
    if not per_kernel:
        print(f"{args.csv}: no gpu__time_duration rows", file=sys.stderr)
        return 1
    total = sum(us for _, us in per_kernel.values())
    fw = max(forwards, 1)
    print(f"{args.csv}: {sum(c for c, _ in per_kernel.values())} kernels, {forwards} forwards, "
          f"GPU time {total / 1e3:.3f} ms = {total / fw / 1e3:.3f} ms per forward")
    for kind, times in sorted(by_kind.items()):
        times = sorted(times)
        print(f"{kind} forwards: {len(times)}, GPU ms per forward: median "
              f"{times[len(times) // 2] / 1e3:.3f}, min {times[0] / 1e3:.3f}, max {times[-1] / 1e3:.3f} "
              "(includes the flush / commit kernels that follow it)")
    print(f"| kernel | launches per forward | us per launch | us per forward | share |")
    print("|---|---|---|---|---|")
    for name, (count, us) in sorted(per_kernel.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name[:90]} | {count / fw:.1f} | {us / count:.2f} | {us / fw:.1f} | "
              f"{100 * us / total:.1f}% |")
    if args.wall:
        with open(args.wall, encoding="utf-8") as f:
            runs = json.load(f)["runs"]
        for r in runs:
            print(f"wall ({r['bench_mode']}, context {r['context']}): {r['ms_per_token']:.3f} ms/token, "
                  f"draft step {r.get('draft_ms_per_step', 0):.3f} ms, verify/AR step "
                  f"{r.get('verify_ms_per_step', 0):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
