"""tools/gpu/ab_summary.py: `quantspec bench` JSON files grouped by one switch's value, with the
speculative runs projected at acceptance 0.9 and each arm's medians against the first arm."""
import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(REPO, "tools", "gpu", "ab_summary.py")


def report(path, switches, runs):
    path.write_text(json.dumps({"kernel_switches": switches, "runs": runs}))
    return str(path)


def spec(draft, verify):
    return {"bench_mode": "quantspec", "context": 131072, "gamma": 3,
            "draft_ms_per_step": draft, "verify_ms_per_step": verify, "ms_per_token": 30.0}


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def test_arms_medians_and_change(tmp_path):
    files = [
        report(tmp_path / "a1.json", {"QS_SW": "1"}, [spec(6.0, 14.0)]),
        report(tmp_path / "b1.json", {"QS_SW": "0"}, [spec(7.0, 14.0)]),
        report(tmp_path / "a2.json", {"QS_SW": "1"}, [spec(6.2, 14.2)]),
        # An AR run of an unset arm and a failed cell (skipped).
        report(tmp_path / "c.json", {}, [{"bench_mode": "ar-int8", "context": 131072,
                                          "gamma": 0, "ms_per_token": 14.5},
                                         {"bench_mode": "ar-fp16", "error": "out of memory"}]),
    ]
    r = run("--switch", "QS_SW", *files)
    assert r.returncode == 0, r.stderr
    # (3 draft + verify) / (1 - 0.9^4) / (1 - 0.9) = 32 / 3.439 for the first run.
    assert "9.305" in r.stdout
    lines = [line for line in r.stdout.splitlines() if "QS_SW=" in line]
    assert len(lines) == 3, r.stdout
    # Arm 1 (first): median draft 6.1, verify 14.1 -> 32.4 / 3.439 = 9.421; arm 0: 35 / 3.439.
    assert "QS_SW=1" in lines[0] and "draft 6.100" in lines[0] and "(+0.00%)" in lines[0]
    assert "QS_SW=0" in lines[1] and "ms/token 10.177" in lines[1] and "(+8.02%)" in lines[1]
    assert "ar-int8" in lines[2] and "QS_SW=unset" in lines[2] and "ms/token 14.500" in lines[2]
    assert "out of memory" not in r.stdout


def test_no_runs_is_an_error(tmp_path):
    r = run("--switch", "QS_SW", report(tmp_path / "e.json", {}, []))
    assert r.returncode == 1
    assert "no runs" in r.stderr
