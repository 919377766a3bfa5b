"""tools/gpu/sass_pre_wait.py: the loads a kernel issues before its PDL wait, from SASS text."""
import os
import subprocess
import sys

from test_sass_loops import REPO, sass

TOOL = os.path.join(REPO, "tools", "gpu", "sass_pre_wait.py")


def run(path, *args):
    return subprocess.run([sys.executable, TOOL, str(path), *args], capture_output=True, text=True)


# A consumer whose weight loads precede the wait (fine) and one of whose activation loads was
# hoisted above it through the read-only path (session 49's bug); a kernel without a wait.
HOISTED = ["LDGSTS.E.BYPASS.128 [R15], desc[UR8][R12.64], P1",
           "LDG.E.U16 R3, desc[UR8][R4.64]",
           "@!P5 LDG.E.CONSTANT R30, desc[UR8][R4.64+0x80]",
           "ACQBULK",
           "@!P3 LDG.E.CONSTANT R42, desc[UR8][R4.64+0x280]",
           "EXIT"]
CLEAN = ["LDG.E.U16 R3, desc[UR8][R4.64]",
         "LDG.E R7, desc[UR8][R4.64+0x80]",
         "ACQBULK",
         "LDG.E.64.STRONG.GPU R4, desc[UR8][R4.64]",
         "LDG.E.CONSTANT R42, desc[UR8][R4.64+0x280]",
         "EXIT"]


def test_flags_a_read_only_load_before_the_wait(tmp_path):
    f = tmp_path / "k.sass"
    f.write_text(sass("_Z8consumerv", HOISTED) + sass("_Z5cleanv", CLEAN) +
                 sass("_Z6nowaitv", ["LDG.E.CONSTANT R1, desc[UR4][R2.64]", "EXIT"]))
    res = run(f)
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert "READ-ONLY consumer: LDG.E.CONSTANT x1, LDG.E.U16 x1" in lines
    assert "clean: LDG.E x1, LDG.E.U16 x1" in lines
    assert not any("nowait" in line for line in lines)
    assert lines[-1].endswith("2 kernels wait (PDL); 1 load through the read-only path before "
                              "the wait")


def test_passes_when_only_weights_precede_the_wait(tmp_path):
    f = tmp_path / "k.sass"
    f.write_text(sass("_Z5cleanv", CLEAN) + sass("_Z8consumerv", HOISTED))
    res = run(f, "--kernel", "clean")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1].endswith("1 kernels wait (PDL); 0 load through the "
                                                "read-only path before the wait")


def test_an_object_without_kernels_passes(tmp_path):
    f = tmp_path / "empty.sass"
    f.write_text("\nFatbin elf code:\n================\n")
    res = run(f)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[-1].endswith("0 kernels wait (PDL); 0 load through the "
                                                "read-only path before the wait")
