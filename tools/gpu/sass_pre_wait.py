#!/usr/bin/env python3
"""Loads a kernel issues before its PDL wait, from its SASS (no GPU needed).

Every kernel launched with programmatic dependent launch (src/backend/cuda/launch.cuh) may run
while the previous kernel still writes; what it reads before `griddepcontrol.wait` (SASS
ACQBULK) must not be anything that kernel writes. Weights and norm weights are fine there (the
ring's LDGSTS, the NormIn weights' LDG). A load through the read-only path (LDG.*.CONSTANT:
ld.global.nc, what nvcc emits for a `const T* __restrict__` it may treat as invariant) is not:
nvcc may hoist such a load above the wait's asm even with its memory clobber, and session 49's
dense deferred norm read h there before the producer's += (4 of 16 loads hoisted; 52 engine
tests failed on the GPU). This lists, per kernel that waits, the loads before its first wait and
exits 1 if any of them is a read-only-path load.

    python3 tools/gpu/sass_pre_wait.py OBJ [--kernel REGEX] [--cuobjdump PATH]

OBJ as for sass_loops.py (an object file or cubin for the GPU, or `cuobjdump -sass` text).
"""
import argparse
import os
import re
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_loops import demangle, kernels, mnemonic, opcode, sass_text, strip_params  # noqa: E402


def loads_before_wait(ins):
    """The load opcodes (with their modifiers) before the first ACQBULK, or None without one."""
    before = Counter()
    for _, text in ins:
        if opcode(text) == "ACQBULK":
            return before
        if opcode(text) == "LDG":
            before[mnemonic(text)] += 1
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("obj")
    ap.add_argument("--kernel", default=".", help="regex on the demangled kernel name")
    ap.add_argument("--cuobjdump", default=None)
    args = ap.parse_args()
    found = list(kernels(sass_text(args.obj, args.cuobjdump)))
    names = demangle([n for n, _ in found])
    pattern = re.compile(args.kernel)
    waiting = bad = 0
    for (_, ins), name in zip(found, names):
        if not pattern.search(name):
            continue
        before = loads_before_wait(ins)
        if before is None:
            continue
        waiting += 1
        read_only = sum(n for op, n in before.items() if ".CONSTANT" in op)
        bad += read_only > 0
        if before:
            short = strip_params(name).replace("(anonymous namespace)::", "")[-90:]
            loads = ", ".join(f"{op} x{n}" for op, n in sorted(before.items()))
            print(f"{'READ-ONLY ' if read_only else ''}{short}: {loads}")
    print(f"# {args.obj}: {waiting} kernels wait (PDL); {bad} load through the read-only path "
          f"before the wait")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
