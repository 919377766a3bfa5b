"""tools/gpu/run_steps.sh: a device call's steps, checked in its dry mode (each step's command
printed, nothing run)."""
import os
import subprocess

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(REPO, "tools", "gpu", "run_steps.sh")


def run(tmp_path, *steps, deadline="540"):
    env = dict(os.environ, QS_STEPS_DRY="1", QS_STEPS_DEADLINE=deadline, OUT=str(tmp_path),
               QS_GPU_BUILD=str(tmp_path / "b"))
    return subprocess.run(["bash", TOOL, *steps], capture_output=True, text=True, env=env)


def test_each_step_becomes_its_command(tmp_path):
    r = run(tmp_path, "build", "test Cuda*:Tiny*", "env QS_A=1 QS_B=2 test X.*",
            "memcheck Y.Z", "bench chain", "ab QS_SW 32768 quantspec,ar-fp16",
            "env QS_AB_SHAPE=llama3.1-8b ab QS_SW 4096 quantspec 1024 2",
            "matrix llama3.1-8b 4096,32768 ar-fp16 2048", "ncu gemv_ring gemv 6",
            "trace llama2-7b 4096 quantspec", "bench attn --quick", "cli llama3.1-8b 12000")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    b = str(tmp_path / "b")
    assert lines == [
        "step 1: env  bash tools/gpu/check.sh build prewait",
        f"step 2: env  {b}/tests/test_cuda --gtest_filter=Cuda*:Tiny*",
        f"step 3: env QS_A=1 QS_B=2 {b}/tests/test_cuda --gtest_filter=X.*",
        f"step 4: env  compute-sanitizer --tool memcheck --error-exitcode 3 {b}/tests/test_cuda"
        " --gtest_filter=Y.Z",
        f"step 5: env  {b}/bench/cuda/bench_ops --sections chain",
        "step 6: env  env QS_AB_SWITCH=QS_SW QS_AB_CONTEXT=32768 QS_AB_MODES=quantspec,ar-fp16"
        " QS_AB_TOKENS=256 QS_AB_REPEATS=1 bash tools/gpu/ab_switch.sh llama2-7b",
        "step 7: env QS_AB_SHAPE=llama3.1-8b env QS_AB_SWITCH=QS_SW QS_AB_CONTEXT=4096"
        " QS_AB_MODES=quantspec QS_AB_TOKENS=1024 QS_AB_REPEATS=2 bash tools/gpu/ab_switch.sh"
        " llama3.1-8b",
        "step 8: env  env QS_MATRIX_CONTEXTS=4096,32768 QS_MATRIX_MODES=ar-fp16"
        " QS_MATRIX_TOKENS=2048 bash tools/gpu/bench_matrix.sh llama3.1-8b",
        "step 9: env  bash tools/gpu/ncu_stalls.sh gemv_ring gemv 6",
        "step 10: env  env QS_TRACE_MODEL=llama2-7b QS_TRACE_CONTEXT=4096 QS_TRACE_MODES=quantspec"
        " bash tools/gpu/trace_decode.sh",
        f"step 11: env  {b}/bench/cuda/bench_ops --sections attn --quick",
        "step 12: env  bash tools/gpu/cli_long_context.sh llama3.1-8b 12000",
    ]


def test_bad_steps_are_named_and_fail_the_call(tmp_path):
    r = run(tmp_path, "tset X", "test", "ab QS_SW 4096", "bench w4layer", "bench attn --slow")
    assert r.returncode == 2
    assert "step 1: bad step 'tset X'" in r.stdout
    assert "step 2: bad step 'test'" in r.stdout
    assert "step 3: bad step 'ab QS_SW 4096'" in r.stdout
    assert "step 4: env" in r.stdout  # the good step still runs
    assert "step 5: bad step 'bench attn --slow'" in r.stdout


def test_no_step_starts_after_the_deadline(tmp_path):
    r = run(tmp_path, "build", "test X", deadline="-1")
    assert r.returncode == 0
    assert "step 1 skipped (deadline): build" in r.stdout
    assert "step 2 skipped (deadline): test X" in r.stdout
