import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST_MODELS = ["llama3-tiny", "llama2-tiny", "mistral-tiny", "qwen2-tiny"]


def pytest_addoption(parser):
    parser.addoption("--quantspec", default=os.path.join(REPO, "build", "quantspec"),
                     help="path of the quantspec binary")


@pytest.fixture(scope="session")
def qs(request):
    binary = request.config.getoption("--quantspec")
    assert os.path.exists(binary), f"build the CLI first: {binary}"

    def run(*args, input=None, check=True, timeout=300):
        p = subprocess.run([binary, *map(str, args)], input=input, capture_output=True,
                           text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"quantspec {' '.join(map(str, args))} failed "
                                 f"({p.returncode}):\n{p.stderr}")
        return p
    return run


def model_dir(name):
    return os.path.join(REPO, "models", "test", name)


def golden_dir(name):
    return os.path.join(REPO, "tests", "data", "golden", name)


@pytest.fixture
def model_copy(tmp_path):
    """A writable copy of a test model, to corrupt."""
    def make(name):
        dst = tmp_path / name
        shutil.copytree(model_dir(name), dst)
        return dst
    return make
