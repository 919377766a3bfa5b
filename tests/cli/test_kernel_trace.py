"""tools/gpu/kernel_trace.py: per-kernel shares of a traced decode forward, with when each kernel's
block 0 became resident (entry, from the previous kernel's release) and how long it then waited
for its own release (lead), from synthetic "qs-trace <entry> <release> <blocks> <threads>" records.
"""
import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(REPO, "tools", "gpu", "kernel_trace.py")


def forward_records(t0):
    """One forward from t0 (ns): an embedding and a norm, four layers of a GEMV (132x512: share
    10 us, resident 4 us before its release) and an attention (512x64: share 30 us, resident 12 us
    before its release, i.e. 2 us before the GEMV's), and a final kernel."""
    kernels = [((16, 256), 5000, 500), ((1, 1024), 5000, 500)]
    kernels += [((132, 512), 10000, 4000), ((512, 64), 30000, 12000)] * 4
    kernels += [((1, 1024), 5000, 500)]
    lines, release = [], t0
    for (blocks, threads), share, lead in kernels:
        lines.append(f"qs-trace {release - lead} {release} {blocks} {threads}")
        release += share
    return lines, release


def test_shares_entries_and_leads(tmp_path):
    lines, t = [], 1_000_000
    for _ in range(5):
        fwd, end = forward_records(t)
        lines += fwd
        t = end + 100_000  # the host's gap between forwards
    trace = tmp_path / "trace.txt"
    trace.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, TOOL, str(trace), "--min-kernels", "5",
                          "--layer-start", "2"], capture_output=True, text=True, check=True).stdout
    assert "layers: 4 x 2 kernels from kernel 2" in out, out
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s+layer: (#\d)\s+(\d+)x(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%"
                     r"\s+(-?[\d.]+)\s+(-?[\d.]+)$", line)
        if m:
            rows[m.group(1)] = [float(x) for x in m.group(4, 5, 8, 9)]
    # [per forward, median share us, median entry us, median lead us]
    assert rows["#0"] == [4, 10.0, 26.0, 4.0], out  # entry: the attention's 30 us share - 4
    assert rows["#1"] == [4, 30.0, -2.0, 12.0], out  # resident 2 us before the GEMV's release


def test_layers_start_where_the_repetition_does(tmp_path):
    """With --names llama and a layer of other than ten kernels, a first layer that launches an
    extra kernel (its q/k/v and a separate RoPE + store) is before the layers, which start at the
    repeating run (attention first), so every layer position holds one kind of kernel."""
    lines, t = [], 1_000_000
    for _ in range(5):
        kernels = [((16, 256), 5000, 500), ((1, 1024), 5000, 500),
                   ((132, 512), 20000, 500), ((24, 256), 4000, 3000)]
        kernels += [((512, 64), 30000, 12000), ((132, 512), 10000, 4000)] * 4
        kernels += [((1, 1024), 5000, 500)]
        release = t
        for (blocks, threads), share, lead in kernels:
            lines.append(f"qs-trace {release - lead} {release} {blocks} {threads}")
            release += share
        t = release + 100_000
    trace = tmp_path / "trace.txt"
    trace.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, TOOL, str(trace), "--min-kernels", "5", "--names",
                          "llama"], capture_output=True, text=True, check=True).stdout
    assert "layers: 4 x 2 kernels from kernel 4" in out, out
    assert re.search(r"before the layers, #3\s+24x256\s+1\s+4\.00", out), out
    assert re.search(r"layer: #0\s+512x64\s+4\s+30\.00", out), out
    assert re.search(r"layer: #1\s+132x512\s+4\s+10\.00", out), out
