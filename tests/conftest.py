"""Shared fixtures. Every test runs the real pipeline: real jail (bubblewrap), real Triton kernels under the
interpreter on the CPU, real SQLite files."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private APPLIANCE_HOME (database, job dirs) per test."""
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("APPLIANCE_DB_URL", raising=False)
    monkeypatch.delenv("APPLIANCE_UNSAFE_NO_JAIL", raising=False)
    monkeypatch.delenv("APPLIANCE_JOBS_DIR", raising=False)  # job folders under this home, as tests expect
    return tmp_path / "home"


def pytest_configure(config):
    # As the referee and the kernel server do (sandbox/harness/common.py): torch's CPU maths settled on one thread
    # before any test runs it on several (an honest softmax failed once without it, pytorch/pytorch#188792).
    from sandbox.harness.common import settle_cpu_math

    settle_cpu_math()


class Appliance:
    """Runs the real CLI in-process; the evaluation itself happens in jailed subprocesses."""

    def __init__(self):
        self.runner = CliRunner()

    def __call__(self, *args: str):
        from appliance.cli import app

        return self.runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    def eval_json(self, task, candidate, *extra: str, device: str = "cpu") -> tuple[int, dict]:
        result = self("eval", task, candidate, "--json", "--device", device, "--baselines", "eager",
                      "--timing-budget", "0.05", *extra)
        return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def appliance(home) -> Appliance:
    return Appliance()


@pytest.fixture
def softmax_task() -> Path:
    return FIXTURES / "tasks" / "rowsoftmax.py"


def candidate(name: str) -> Path:
    return FIXTURES / "candidates" / f"{name}.py"


@pytest.fixture
def fake_llm():
    """Starts tests.fake_llm.FakeLLM servers (arguments as FakeLLM's); all are stopped after the test."""
    from tests.fake_llm import FakeLLM

    servers = []

    def start(*behaviours, **kw) -> FakeLLM:
        server = FakeLLM(*behaviours, **kw)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.release.set()
        server.shutdown()
        server.server_close()


def run_in_terminal(argv: list[str], timeout_s: float) -> tuple[int, bytes]:
    """Run argv in a pseudo-terminal (as over SSH, 200 columns) until it exits; its exit code and all it drew."""
    import pty
    import select
    import subprocess
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, start_new_session=True,
                            env=os.environ | {"TERM": "xterm-256color", "COLUMNS": "200"})
    os.close(slave)
    screen, deadline = b"", time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    screen += os.read(master, 65536)
                except OSError:  # the terminal closed as it exited
                    break
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return proc.wait(timeout=10), screen
