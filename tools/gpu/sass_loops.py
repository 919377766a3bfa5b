#!/usr/bin/env python3
"""Instruction counts of the hot loops of CUDA kernels, from their SASS (no GPU needed).

A kernel that is issue-bound (ncu: few eligible warps, ~1 instruction issued every few cycles)
gets faster with fewer instructions per iteration; this script counts them per kernel, so that a
change can be judged on the development machine before a device call.

    python3 tools/gpu/sass_loops.py OBJ [--kernel REGEX] [--min-mma N] [--regions]
                                        [--cuobjdump PATH]

OBJ: an object file or cubin built for the GPU (e.g. the CUDA build's
src/backend/cuda/CMakeFiles/qs_backend_cuda.dir/attention_quant.cu.o), or a text file that
already holds `cuobjdump -sass` output. For each kernel whose (demangled) name matches REGEX,
the loop reported is the smallest backward branch whose body holds at least N tensor-core
instructions (HMMA / IMMA / HGMMA), i.e. the main loop of an MMA kernel; with --min-mma 0 the
innermost loop that holds the most instructions. Printed: its instruction count and the count
of each opcode class worth watching (moves, loads, spills, byte permutes, ...).

The count is static: every instruction of the loop once. A region that a forward branch inside
the loop can skip may run on few iterations only (the quantized attention's query fold runs once
per key group, every fourth 32-token sub-chunk at G = 128: 312 of the one-query draft's 758
instructions, session 29). --regions lists each such region under its kernel's row (its first
and last address, its instruction count, the branch); nested regions are listed too.

cuobjdump is not part of every CUDA install; PyPI carries it:
    pip download --no-deps nvidia-cuda-cuobjdump -d /tmp/whl && unzip -o /tmp/whl/*.whl -d /tmp/cu
    python3 tools/gpu/sass_loops.py OBJ --cuobjdump /tmp/cu/nvidia/cu13/bin/cuobjdump
"""
import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter

WATCH = ["HMMA", "IMMA", "MOV", "LDG", "LDS", "LDL", "STL", "PRMT", "LOP3", "HADD2", "HFMA2",
         "FMUL", "FFMA", "IMAD", "IADD3", "SHFL", "MUFU"]
INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(?:`\(\S+\)\s*)?0x([0-9a-f]+)")


def sass_text(path, cuobjdump):
    with open(path, "rb") as f:
        head = f.read(4096)
    if b"Function :" in head or path.endswith((".sass", ".txt")):
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    tool = cuobjdump or shutil.which("cuobjdump")
    if not tool:
        sys.exit("sass_loops: no cuobjdump on PATH (see --help for where to get one)")
    res = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"sass_loops: cuobjdump failed on {path}: {res.stderr.strip()}")
    return res.stdout


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool:
        return names
    res = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    out = res.stdout.split("\n")
    return out[: len(names)] if res.returncode == 0 and len(out) >= len(names) else names


def strip_params(name):
    """The demangled name without its trailing parameter list."""
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0 and name[i] == "(":
            return name[:i]
    return name


def mnemonic(text):
    """The instruction's opcode with its modifiers (LDG.E.CONSTANT), without its predicate."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def opcode(text):
    return mnemonic(text).split(".")[0]


def kernels(text):
    """(mangled name, [(address, instruction text)]) per function of the dump."""
    for part in re.split(r"(?m)^[ \t]*Function : ", text)[1:]:
        name, _, body = part.partition("\n")
        ins = []
        for line in body.split("\n"):
            m = INSTR.match(line)
            if m:
                ins.append((int(m.group(1), 16), " ".join(m.group(2).split())))
        yield name.strip(), ins


def backward_loops(ins):
    """(start, end) indices of every loop: a branch back to an address inside the function."""
    index = {a: i for i, (a, _) in enumerate(ins)}
    for i, (a, t) in enumerate(ins):
        m = BRANCH.search(t)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            yield index[int(m.group(1), 16)], i


def hot_loop(ins, min_mma):
    best = None
    for start, end in backward_loops(ins):
        body = ins[start: end + 1]
        mma = sum(opcode(x) in ("HMMA", "IMMA", "HGMMA") for x in (b for _, b in body))
        if min_mma > 0:
            if mma >= min_mma and (best is None or len(body) < len(best)):
                best = body
        elif best is None or len(body) > len(best):
            best = body
    return best


def skippable_regions(loop):
    """(first address, last address, instructions, branch text) of each stretch of the loop that a
    forward branch inside it jumps over (the warp-divergence checks, BRA.DIV, excluded)."""
    addrs = [a for a, _ in loop]
    out = []
    for i, (a, t) in enumerate(loop):
        m = BRANCH.search(t)
        if not m or ".DIV" in t.split()[1 if t.startswith("@") else 0]:
            continue
        target = int(m.group(1), 16)
        if target <= a or target > addrs[-1]:
            continue
        inside = [x for x in addrs[i + 1:] if x < target]
        if inside:
            out.append((inside[0], inside[-1], len(inside), t))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("obj")
    ap.add_argument("--kernel", default=".", help="regex on the demangled kernel name")
    ap.add_argument("--min-mma", type=int, default=16)
    ap.add_argument("--regions", action="store_true",
                    help="list the loop's regions that a forward branch can skip")
    ap.add_argument("--cuobjdump", default=None)
    args = ap.parse_args()
    found = list(kernels(sass_text(args.obj, args.cuobjdump)))
    if not found:
        sys.exit(f"sass_loops: no SASS functions in {args.obj}")
    names = demangle([n for n, _ in found])
    pattern = re.compile(args.kernel)
    print(f"# {args.obj}: {len(found)} kernels; loop = smallest loop with >= {args.min_mma} MMAs")
    print("kernel | total | loop | " + " | ".join(WATCH))
    shown = 0
    for (_, ins), name in zip(found, names):
        if not pattern.search(name):
            continue
        shown += 1
        loop = hot_loop(ins, args.min_mma)
        short = strip_params(name).replace("(anonymous namespace)::", "")[-90:]
        if loop is None:
            print(f"{short} | {len(ins)} | no such loop")
            continue
        c = Counter(opcode(t) for _, t in loop)
        print(f"{short} | {len(ins)} | {len(loop)} | " + " | ".join(str(c[w]) for w in WATCH))
        if args.regions:
            for first, last, n, branch in skippable_regions(loop):
                print(f"  skippable {first:#x}..{last:#x}: {n} instructions ({branch})")
    if shown == 0:
        sys.exit(f"sass_loops: no kernel matches {args.kernel!r}")


if __name__ == "__main__":
    main()
