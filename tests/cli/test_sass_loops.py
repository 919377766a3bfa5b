"""tools/gpu/sass_loops.py: instruction counts of a kernel's hot loop from `cuobjdump -sass` text."""
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(REPO, "tools", "gpu", "sass_loops.py")


def sass(name, body):
    lines = [f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90\""]
    for i, text in enumerate(body):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;      /* 0x0 */")
    return "\n".join(lines) + "\n"


def run(path, *args):
    return subprocess.run([sys.executable, TOOL, str(path), *args], capture_output=True, text=True)


def test_counts_the_smallest_loop_holding_the_mmas(tmp_path):
    # An outer loop (0x10 .. 0xd0) around an inner one (0x20 .. 0xb0) with 2 HMMA.
    body = ["MOV R1, c[0x0][0x28]",            # 0x00
            "IADD3 R2, R2, 0x1, RZ",           # 0x10 outer start
            "LDG.E.128 R4, desc[UR4][R2.64]",  # 0x20 inner start
            "PRMT R8, R4, 0x5410, R5",
            "HMMA.16816.F32 R12, R8, R4, R12",
            "MOV R9, UR4",
            "HMMA.16816.F32 R16, R8, R4, R16",
            "LOP3.LUT R9, R9, 0xf, RZ, 0xc0, !PT",
            "ISETP.GE.AND P0, PT, R2, R3, PT",
            "@P1 BRA 0xa0",                    # 0x90: a forward skip inside (not a loop)
            "HADD2 R9, R9, -1032, -1032",
            "@!P0 BRA 0x20",                   # 0xb0: closes the inner loop (10 instructions)
            "NOP",
            "@!P0 BRA 0x10",                   # 0xd0: closes the outer loop
            "EXIT"]
    f = tmp_path / "k.sass"
    f.write_text(sass("_Z6kernelv", body) + sass("_Z5otherv", ["EXIT"]))
    res = run(f, "--min-mma", "2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    header = lines[1].split(" | ")
    assert header[:3] == ["kernel", "total", "loop"]
    # One row per kernel, named without its parameter list (demangled where c++filt exists).
    line = next(l for l in lines[2:] if l.startswith(("kernel |", "_Z6kernelv |")))
    cells = dict(zip(header, line.split(" | ")))
    assert cells["total"] == "15"
    assert cells["loop"] == "10"
    assert cells["HMMA"] == "2"
    assert cells["MOV"] == "1"
    assert cells["LDG"] == "1"
    assert cells["PRMT"] == "1"
    assert cells["HADD2"] == "1"
    # The other kernel has no loop with MMAs.
    assert "no such loop" in res.stdout
    # Asking for more MMAs than any loop holds, the same kernel has none either.
    res = run(f, "--min-mma", "3", "--kernel", "^(kernel|_Z6)")
    assert res.returncode == 0 and "no such loop" in res.stdout


def test_lists_the_regions_a_forward_branch_skips(tmp_path):
    # A loop (0x00 .. 0x90) with a 3-instruction region behind a branch (a fold that runs once per
    # group), a divergence check (BRA.DIV, not a region) and a branch out of the loop (not one).
    body = ["LDG.E.128 R4, desc[UR4][R2.64]",  # 0x00 loop start
            "BRA.DIV UR4, 0x200",              # 0x10
            "@P0 BRA 0x60",                    # 0x20: skips 0x30 .. 0x50
            "HADD2.F32 R1, -RZ, R4.H0_H0",
            "FMUL R1, R1, R5",
            "SHFL.BFLY PT, R6, R1, 0x1, 0x1f",
            "HMMA.16816.F32 R12, R8, R4, R12",  # 0x60
            "@P2 BRA 0x200",                   # 0x70: leaves the loop
            "HMMA.16816.F32 R16, R8, R4, R16",
            "@!P1 BRA 0x0",                    # 0x90: closes the loop
            "EXIT"]
    f = tmp_path / "k.sass"
    f.write_text(sass("_Z6kernelv", body))
    res = run(f, "--min-mma", "2", "--regions")
    assert res.returncode == 0, res.stderr
    regions = [l for l in res.stdout.splitlines() if l.startswith("  skippable")]
    assert regions == ["  skippable 0x30..0x50: 3 instructions (@P0 BRA 0x60)"]
    # Without the flag, the table alone.
    assert "skippable" not in run(f, "--min-mma", "2").stdout


def test_bad_input_is_named(tmp_path):
    f = tmp_path / "empty.sass"
    f.write_text("nothing here\n")
    res = run(f)
    assert res.returncode != 0 and "no SASS functions" in res.stderr
    f.write_text(sass("_Z6kernelv", ["EXIT"]))
    res = run(f, "--kernel", "nomatch")
    assert res.returncode != 0 and "no kernel matches" in res.stderr
