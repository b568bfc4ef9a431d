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
