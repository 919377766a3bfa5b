"""Fixtures for the HTTP server tests: start `quantspec serve` on a free loopback port.

The test models ship without a chat template; chat tests run on model directories assembled in a
temporary folder from models/test/<name> (symlinks) plus the fixture tokenizer_config.json of
tests/chat/data/tokenizer_configs/<name>.json, which carries a public chat template.
"""
import os

import pytest

from serverlib import REPO, TEST_MODELS, ServerProcess


def pytest_addoption(parser):
    try:
        parser.addoption("--quantspec", default=os.path.join(REPO, "build", "quantspec"),
                         help="path of the quantspec binary")
    except ValueError:  # tests/cli's conftest.py adds the same option when both folders run
        pass


@pytest.fixture(scope="session")
def quantspec_binary(request):
    binary = os.path.abspath(request.config.getoption("--quantspec"))
    assert os.path.exists(binary), f"build the CLI first: {binary}"
    return binary


@pytest.fixture(scope="session")
def chat_models(tmp_path_factory):
    """name -> a model directory with a chat template (fixture tokenizer_config.json)."""
    root = tmp_path_factory.mktemp("chat_models")
    dirs = {}
    for name in TEST_MODELS:
        src = os.path.join(REPO, "models", "test", name)
        dst = root / name
        dst.mkdir()
        for f in os.listdir(src):
            if f != "tokenizer_config.json":
                os.symlink(os.path.join(src, f), dst / f)
        cfg = os.path.join(REPO, "tests", "chat", "data", "tokenizer_configs", name + ".json")
        (dst / "tokenizer_config.json").write_bytes(open(cfg, "rb").read())
        dirs[name] = str(dst)
    return dirs


@pytest.fixture(scope="session")
def start_server(quantspec_binary):
    """start_server(*args) -> ServerProcess, stopped (SIGTERM) at the end of the session."""
    started = []

    def start(*args, env=None):
        s = ServerProcess(quantspec_binary, args, env=env)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def server(start_server, chat_models):
    """The shared server: the bundled model's architecture (llama3-tiny) with its chat template."""
    s = start_server("-m", chat_models["llama3-tiny"], "--ctx", "1024", "-n", "32")
    yield s
    assert s.alive(), "the shared server died during the tests:\n" + s.stderr
