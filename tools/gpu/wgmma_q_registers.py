#!/usr/bin/env python3
"""Checks, in SASS, that no loop of the wgmma prefill kernels overwrites the registers its
S = Q K^T wgmmas read Q from (no GPU needed).

Q is loaded once before a kernel's loop and read by the S wgmmas of every key tile, so inside a
loop nothing may write those registers. Session 17 met a ptxas (CUDA 13.0) register allocation
bug that did: with a branch between the exact kernel's S and its P V, ptxas gave P hi / lo the
registers of Q hi / lo, so every tile after the first multiplied K by the previous tile's P (the
PTX kept them apart; the GPU test ExactSweep failed 0.85 off). This check reads the compiled
object, so it catches a recurrence (a kernel edit, another CUDA version) before a device call.

    python3 tools/gpu/wgmma_q_registers.py OBJ [--cuobjdump PATH]

OBJ: the CUDA build's src/backend/cuda/CMakeFiles/qs_backend_cuda.dir/attention_prefill_wgmma.cu.o
(or a text file holding `cuobjdump -sass` output). The S wgmmas are the HGMMAs with a register A
operand and a K-major B (no `.tnspB`); P V's carry `.tnspB`. Exit status 1 (with the offending
instructions) if a loop writes a Q register, 2 if no loop with S wgmmas was found.
cuobjdump: see tools/gpu/sass_loops.py --help (PyPI carries it).
"""
import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_loops import backward_loops, demangle, kernels, opcode, sass_text, strip_params  # noqa: E402

HGMMA_A = re.compile(r"HGMMA\.\S+\s+R\d+,\s+R(\d+),\s+gdesc")
# Instructions whose first operand is not a register they write.
NO_DEST = ("ST", "STS", "STG", "STL", "RED", "ATOM", "BRA", "BAR", "WARPGROUP", "DEPBAR", "EXIT",
           "LDGSTS", "HGMMA", "MEMBAR", "FENCE", "NOP", "CALL", "RET", "BSYNC", "BSSY", "WARPSYNC",
           "LDGDEPBAR", "ARRIVES", "SYNCS", "UTMALDG", "UBLKCP")


def written_registers(text):
    """General registers an instruction writes (its first operand), with the width suffix."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    if not words or opcode(text) in NO_DEST:
        return set()
    m = re.match(r"R(\d+)\b", " ".join(words[1:]))
    if not m:
        return set()
    first, width = int(m.group(1)), 1
    if ".64" in words[0] or ".WIDE" in words[0]:
        width = 2
    if ".128" in words[0]:
        width = 4
    return set(range(first, first + width))


def last_exit(ins):
    """The index of the function's last unpredicated EXIT (its main body ends there)."""
    exits = [i for i, (_, t) in enumerate(ins) if t.split()[:1] == ["EXIT"]]
    return exits[-1] if exits else len(ins)


def check_kernel(ins):
    """(loops with S wgmmas, [problems]). Back-edges past the last EXIT are not loops: ptxas puts
    the slow path of an mbarrier wait (TRYWAIT until the phase flips) out of line after it, and
    its `BRA` back into the body spans code that runs once (the warp-specialized kernels)."""
    found, problems = 0, []
    body_end = last_exit(ins)
    for start, end in backward_loops(ins):
        if end > body_end:
            continue
        body = ins[start : end + 1]
        q = set()
        for _, text in body:
            m = HGMMA_A.search(text)
            if m and ".tnspB" not in text:
                q |= set(range(int(m.group(1)), int(m.group(1)) + 4))
        if not q:
            continue
        found += 1
        for addr, text in body:
            hit = written_registers(text) & q
            if hit:
                problems.append(f"  /*{addr:04x}*/ {text}   (writes Q register R{min(hit)})")
    return found, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("obj")
    ap.add_argument("--cuobjdump")
    args = ap.parse_args()
    ks = [(name, ins) for name, ins in kernels(sass_text(args.obj, args.cuobjdump))
          if "attention_prefill_wgmma_kernel" in name]
    names = demangle([name for name, _ in ks])
    total, bad = 0, False
    for (_, ins), name in zip(ks, names):
        found, problems = check_kernel(ins)
        total += found
        short = strip_params(name).split("::")[-1]
        print(f"{short}: {found} loop(s) with S wgmmas, {'Q overwritten' if problems else 'Q intact'}")
        if problems:
            bad = True
            print("\n".join(problems[:12]))
    if total == 0:
        print("wgmma_q_registers: no loop with S wgmmas found (not the wgmma prefill object?)")
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
