#!/usr/bin/env python3
"""Per-kernel shares of a decode step's critical path, from a QS_KERNEL_TRACE build's output.

Build with the definition (on the device: QS_GPU_BUILD=$PWD/build-trace
QS_CMAKE_EXTRA="-DCMAKE_CUDA_FLAGS=-DQS_KERNEL_TRACE" bash tools/gpu/build_on_device.sh
quantspec), run a short decode, and give this script its stdout:

    QS_KERNEL_TRACE_FILE=trace.txt build-trace/quantspec bench ... -n 16
    python3 tools/gpu/kernel_trace.py trace.txt

Every kernel's block 0 records when it reached pdl_begin() and when its wait for the previous
kernel returned (%globaltimer, ns), and the backend writes the records out at its end as
"qs-trace <entry> <release> <blocks> <threads>" lines (launch.cuh, cuda_backend.cu). In
a stream of dependent kernels the next release follows this kernel's completion, so
release[i + 1] - release[i] is kernel i's share of the step's time as the CUDA graph runs it
(its work after the wait, its tail and the hand-over). Kernels are told apart by their launch
shape (blocks x threads). Rounds are separated by gaps longer than --gap-us (the host between
graph launches).

Prints, over the last --rounds rounds: per launch shape the count and the median / total share;
then the sequence of the last round with each kernel's share and how long its block 0 had been
resident before the release (its lead).
"""
import argparse
import statistics
import sys


def read_events(path):
    events = []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.startswith("qs-trace "):
                continue
            parts = line.split()
            if len(parts) != 5:
                continue
            entry, release, blocks, threads = (int(x) for x in parts[1:])
            events.append((release, entry, blocks, threads))
    events.sort()
    return events


def split_rounds(events, gap_ns):
    rounds, cur = [], []
    for i, e in enumerate(events):
        if cur and e[0] - cur[-1][0] > gap_ns:
            rounds.append(cur)
            cur = []
        cur.append(e)
    if cur:
        rounds.append(cur)
    return rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--rounds", type=int, default=4, help="rounds summarised (the last ones)")
    ap.add_argument("--gap-us", type=float, default=30.0, help="a gap that separates rounds")
    ap.add_argument("--min-kernels", type=int, default=50, help="shorter rounds are skipped")
    args = ap.parse_args()
    events = read_events(args.log)
    if not events:
        sys.exit(f"{args.log}: no qs-trace lines (a QS_KERNEL_TRACE build?)")
    rounds = [r for r in split_rounds(events, args.gap_us * 1e3) if len(r) >= args.min_kernels]
    if not rounds:
        sys.exit("no round with enough kernels")
    rounds = rounds[-args.rounds:]
    shares = {}
    total = 0.0
    for r in rounds:
        for i in range(len(r) - 1):
            d = (r[i + 1][0] - r[i][0]) / 1e3
            shares.setdefault((r[i][2], r[i][3]), []).append(d)
            total += d
    print(f"{len(events)} kernels traced; {len(rounds)} rounds summarised, "
          f"{total / 1e3:.3f} ms between their first and last releases")
    print(f"{'blocks':>7} {'threads':>7} {'count':>6} {'median us':>10} {'total ms':>9} {'share':>6}")
    for key, ds in sorted(shares.items(), key=lambda kv: -sum(kv[1])):
        print(f"{key[0]:>7} {key[1]:>7} {len(ds):>6} {statistics.median(ds):>10.2f} "
              f"{sum(ds) / 1e3:>9.3f} {100 * sum(ds) / total:>5.1f}%")
    last = rounds[-1]
    print("\nlast round: kernel, blocks x threads, share (us), lead of block 0 (us)")
    for i, (rel, ent, b, t) in enumerate(last):
        share = (last[i + 1][0] - rel) / 1e3 if i + 1 < len(last) else float("nan")
        print(f"{i:5d} {b:7d} x {t:<5d} {share:8.2f} {(rel - ent) / 1e3:8.2f}")


if __name__ == "__main__":
    main()
