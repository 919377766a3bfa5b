#!/usr/bin/env python3
"""Per-kernel shares of a decode forward's time, from a QS_KERNEL_TRACE build's records.

Build with the definition (on the device: QS_GPU_BUILD=$PWD/build-trace
QS_CMAKE_EXTRA="-DCMAKE_CUDA_FLAGS=-DQS_KERNEL_TRACE" bash tools/gpu/build_on_device.sh
quantspec), run a short decode, and give this script the records:

    QS_KERNEL_TRACE_FILE=trace.txt build-trace/quantspec bench ... -n 16
    python3 tools/gpu/kernel_trace.py trace.txt --names llama

Every kernel's block 0 records when it reached pdl_begin() and when its wait for the previous
kernel returned (%globaltimer, ns), and the backend writes the records out at its end as
"qs-trace <entry> <release> <blocks> <threads>" lines (launch.cuh, cuda_backend.cu). In a stream
of dependent kernels the next release follows this kernel's completion, so release[i + 1] -
release[i] is kernel i's share of the forward as it runs (its work after the wait, its tail and
the hand-over); the last kernel's share runs to the next forward's first release (the host's
part between forwards). Kernels are known by their launch shape (blocks x threads).

A forward starts at a kernel whose block 0 was not resident before its release (lead < 2 us)
after a gap of more than --gap-us since the previous release (the host launched it after a
synchronization). Forwards are grouped by kind (kernel count and first launch shape: a draft
step, a verification, a prefill chunk); for the most frequent decode kinds the script finds the
layer period (the shortest shift under which the launch shapes repeat) and prints, per position
in the layer, the median share and its total per forward, then the kernels before and after
the layers. Two more medians show how programmatic dependent launch overlapped the hand-over:
"entry" is when block 0 reached pdl_begin() relative to the previous kernel's release (negative:
resident before the previous kernel started its work), "lead" how long it then waited for its
own release (a kernel whose blocks need a whole SM becomes resident only as the previous
kernel's blocks leave, so its entry trails that release by the previous kernel's fastest block).
"""
import argparse
import collections
import statistics
import sys

LLAMA_LAYER = ["qkv", "rope+store", "attention", "combine", "o", "add+norm", "gate/up", "swiglu",
               "down", "add+norm (next)"]


def read_events(path):
    events = []
    with open(path, errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 5 and parts[0] == "qs-trace":
                entry, release, blocks, threads = (int(x) for x in parts[1:])
                events.append((release, entry, blocks, threads))
    events.sort()
    return events


def forward_starts(ev, gap_ns):
    return [i for i in range(1, len(ev))
            if ev[i][0] - ev[i][1] < 2000 and ev[i][0] - ev[i - 1][0] > gap_ns]


def layer_period(shapes):
    """(start, period, repeats) of the longest run of a repeating launch-shape pattern (where
    the run starts is ambiguous by a rotation of the pattern: --layer-start fixes it)."""
    best = (0, 0, 0)
    for p in range(2, 41):
        run = 0
        for i in range(len(shapes) - p):
            run = run + 1 if shapes[i] == shapes[i + p] else 0
            reps = (run + p) // p
            if reps >= 3 and reps * p > best[1] * best[2]:
                best = (i + 1 - run, p, reps)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--forwards", type=int, default=8, help="forwards of a kind summarised (the last)")
    ap.add_argument("--kinds", type=int, default=2, help="forward kinds shown (most frequent first)")
    ap.add_argument("--gap-us", type=float, default=20.0)
    ap.add_argument("--min-kernels", type=int, default=50, help="smaller forwards are skipped")
    ap.add_argument("--names", default="", help="'llama' or comma-separated names of the layer's kernels")
    ap.add_argument("--layer-start", type=int, default=-1,
                    help="index of the first layer's first kernel (default: 2 with --names llama "
                    "and its ten-kernel layer, after the embedding and the first norm; else where "
                    "the repetition starts)")
    args = ap.parse_args()
    ev = read_events(args.trace)
    if not ev:
        sys.exit(f"{args.trace}: no qs-trace records (a QS_KERNEL_TRACE build?)")
    starts = forward_starts(ev, args.gap_us * 1e3)
    bounds = list(zip(starts, starts[1:]))
    kinds = collections.Counter((b - a, ev[a][2:]) for a, b in bounds if b - a >= args.min_kernels)
    print(f"{args.trace}: {len(ev)} kernels, {len(bounds)} forwards; decode kinds (kernels, first "
          f"launch): {', '.join(f'{k[0]} x {k[1][0]}x{k[1][1]}: {n}' for k, n in kinds.most_common(6))}")
    names = LLAMA_LAYER if args.names == "llama" else [s for s in args.names.split(",") if s]
    for (count, first), _ in kinds.most_common(args.kinds):
        sel = [(a, b) for a, b in bounds if b - a == count and ev[a][2:] == first][-args.forwards:]
        spans = [(ev[b][0] - ev[a][0]) / 1e3 for a, b in sel]
        shapes = [ev[i][2:] for i in range(sel[0][0], sel[0][1])]
        start, period, reps = layer_period(shapes)
        # --names llama's ten-kernel layer starts after the embedding and the first norm; any other
        # period starts where the repetition does (a first layer that launches more kernels than
        # the rest, e.g. its q/k/v and a separate RoPE + store, is then before the layers).
        llama_layout = args.names == "llama" and period == len(LLAMA_LAYER)
        layer_start = args.layer_start if args.layer_start >= 0 else (2 if llama_layout else -1)
        if layer_start >= 0 and period:
            start, reps = layer_start, min(reps, (count - layer_start) // period)
        print(f"\n== {count} kernels from a {first[0]}x{first[1]} launch: {len(sel)} forwards, "
              f"median {statistics.median(spans):.1f} us each; layers: {reps} x {period} kernels "
              f"from kernel {start}")
        # The names fit only a layer of as many kernels (another period: positions, not names).
        layer_names = names if period == len(names) else []
        rows = collections.OrderedDict()
        for a, b in sel:
            for k in range(count):
                i = a + k
                share = (ev[i + 1][0] - ev[i][0]) / 1e3
                if k < start:
                    key = f"before the layers, #{k}"
                elif k < start + period * reps:
                    j = (k - start) % period
                    key = f"layer: {layer_names[j] if j < len(layer_names) else f'#{j}'}"
                else:
                    key = f"after the layers, #{k - start - period * reps}"
                entry = (ev[i][1] - ev[i - 1][0]) / 1e3
                lead = (ev[i][0] - ev[i][1]) / 1e3
                rows.setdefault((key, ev[i][2:]), []).append((share, entry, lead))
        print(f"  {'kernel':28s} {'launch':>10s} {'x':>3s} {'median us':>9s} {'per fwd ms':>10s} "
              f"{'share':>6s} {'entry us':>9s} {'lead us':>8s}")
        total = statistics.median(spans)
        for (key, shape), v in rows.items():
            per = len(v) / len(sel)
            share, entry, lead = (statistics.median(x) for x in zip(*v))
            per_fwd = share * per
            print(f"  {key:28s} {shape[0]:>6d}x{shape[1]:<4d} {per:3.0f} {share:9.2f} "
                  f"{per_fwd / 1e3:10.3f} {100 * per_fwd / total:5.1f}% {entry:9.2f} {lead:8.2f}")


if __name__ == "__main__":
    main()
