"""tools/gpu/wgmma_q_registers.py: no loop of the wgmma prefill kernels may write the registers its
S wgmmas read Q from (session 17's ptxas register allocation bug), from `cuobjdump -sass` text."""
import os
import subprocess
import sys

from test_sass_loops import sass

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(REPO, "tools", "gpu", "wgmma_q_registers.py")
KERNEL = "_ZN2qs4cuda30attention_prefill_wgmma_kernelILi128ELb1EEEvNS0_13AttentionArgsE"


def run(path):
    return subprocess.run([sys.executable, TOOL, str(path)], capture_output=True, text=True)


def loop(p_dest):
    """A kernel whose loop computes S from Q (R152..R155), then P into p_dest, then P V."""
    return ["MOV R1, c[0x0][0x28]",                                       # 0x00
            "WARPGROUP.ARRIVE",                                           # 0x10 loop start
            "HGMMA.64x128x16.F32 R24, R152, gdesc[UR8], RZ, !UPT, gsb0",  # S = Q K^T
            "WARPGROUP.DEPBAR.LE gsb0, 0x0",
            "MUFU.EX2 R24, R24",
            f"F2FP.F16.F32.PACK_AB {p_dest}, R25, R24",                   # P
            "STS.128 [R3], R152",                                         # reads Q: no write
            "HGMMA.64x128x16.F32 R88, R24, gdesc[UR8].tnspB, R88, gsb0",  # O += P V
            "@!P0 BRA 0x10",
            "EXIT"]


def test_q_intact_passes_and_q_overwritten_fails(tmp_path):
    good = tmp_path / "good.sass"
    good.write_text(sass(KERNEL, loop("R24")))
    res = run(good)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 loop(s) with S wgmmas, Q intact" in res.stdout

    bad = tmp_path / "bad.sass"
    bad.write_text(sass(KERNEL, loop("R154")))  # P written into Q's registers
    res = run(bad)
    assert res.returncode == 1
    assert "Q overwritten" in res.stdout and "F2FP" in res.stdout and "R154" in res.stdout


def test_an_mbarrier_waits_out_of_line_retry_is_not_a_loop(tmp_path):
    # The loop as above, P into its own registers; after it (0x90) code that writes Q's registers
    # once (the epilogue), the main EXIT, then the wait's retry stub that branches back to the
    # loop's start: the span 0x10 .. 0xe0 is not a loop body.
    body = loop("R24")[:-1] + ["FADD R154, -R152, 12",                          # 0x90
                               "@!P1 BRA 0xd0",                                 # 0xa0
                               "EXIT",                                          # 0xb0
                               "NOP",                                           # 0xc0
                               "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R3",  # 0xd0
                               "@!P1 BRA 0xd0",                                 # 0xe0
                               "BRA 0x10"]                                      # 0xf0
    f = tmp_path / "ws.sass"
    f.write_text(sass(KERNEL, body))
    res = run(f)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 loop(s) with S wgmmas, Q intact" in res.stdout


def test_an_object_without_the_kernels_loops_is_named(tmp_path):
    f = tmp_path / "other.sass"
    f.write_text(sass("_Z5otherv", ["EXIT"]))
    res = run(f)
    assert res.returncode == 2 and "no loop with S wgmmas" in res.stdout
