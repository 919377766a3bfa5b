"""tools/gpu/ncu_summary.py: an `ncu --csv --metrics gpu__time_duration.sum` log summed per kernel
and per forward (a forward starts at the embedding kernel; a forward with a 4-bit GEMV is a draft).
"""
import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(REPO, "tools", "gpu", "ncu_summary.py")

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def row(i, kernel, unit, value):
    return (f'"{i}","1","quantspec","h","{kernel}","1","7","(64, 1, 1)","(16, 32, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')


def test_sums_per_kernel_and_per_forward(tmp_path):
    kernels = [
        # A kernel before the first forward (prefill tail): counted per kernel, not per forward.
        ("void qs::cuda::rmsnorm_kernel(const float *, int)", "usecond", "4"),
        # Draft forward: embedding, a 4-bit GEMV, the quantized attention.
        ("void qs::cuda::(anonymous namespace)::embedding_kernel<__nv_bfloat16>(int)", "nsecond", "2,000"),
        ("void qs::cuda::(anonymous namespace)::gemv_q4_cc_kernel<1, 2, 2, true>(const float *)",
         "usecond", "15.5"),
        ("void qs::cuda::(anonymous namespace)::attention_quant_direct_kernel<false, 192>"
         "(qs::cuda::(anonymous namespace)::Params)", "usecond", "93"),
        # Target forward: embedding, a bf16 GEMV.
        ("void qs::cuda::(anonymous namespace)::embedding_kernel<__nv_bfloat16>(int)", "nsecond", "2,000"),
        ("void qs::cuda::(anonymous namespace)::gemv_mma_kernel<__nv_bfloat16, 1, 4, 1>(const float *)",
         "msecond", "0.0205"),
    ]
    csv = tmp_path / "ncu.csv"
    csv.write_text("==PROF== Connected to process 1\n" + HEADER + "\n" +
                   "\n".join(row(i, *k) for i, k in enumerate(kernels)) + "\n")
    wall = tmp_path / "wall.json"
    wall.write_text(json.dumps({"runs": [{"bench_mode": "quantspec", "context": 32768,
                                          "ms_per_token": 9.0, "draft_ms_per_step": 6.9,
                                          "verify_ms_per_step": 10.3}]}))
    out = subprocess.run([sys.executable, TOOL, str(csv), "--wall", str(wall)], check=True,
                         capture_output=True, text=True).stdout
    assert "6 kernels, 2 forwards" in out
    # Draft forward: 2 + 15.5 + 93 us; target: 2 + 20.5 us.
    assert "draft forwards: 1, GPU ms per forward: median 0.111" in out
    assert "target forwards: 1, GPU ms per forward: median 0.022" in out
    # Names without return type, namespaces and parameters; units converted to us.
    assert "| attention_quant_direct_kernel<false, 192> | 0.5 | 93.00 | 46.5 |" in out
    assert "| gemv_mma_kernel<__nv_bfloat16, 1, 4, 1> | 0.5 | 20.50 | 10.2 |" in out
    assert "| rmsnorm_kernel | 0.5 | 4.00 | 2.0 |" in out
    assert "wall (quantspec, context 32768): 9.000 ms/token" in out


def test_no_rows_is_an_error(tmp_path):
    csv = tmp_path / "empty.csv"
    csv.write_text("==PROF== nothing profiled\n")
    p = subprocess.run([sys.executable, TOOL, str(csv)], capture_output=True, text=True)
    assert p.returncode == 1 and "no gpu__time_duration rows" in p.stderr
