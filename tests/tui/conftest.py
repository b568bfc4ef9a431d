"""One real optimisation run on the CPU (real jail, Triton interpreter, real SQLite), made once per test session,
and a private copy of its database for each test. tests/test_review.py uses these fixtures too."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Callable

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO, candidate

SOFTMAX = REPO / "benchmarks/tasks/softmax.py"
FAST = ("--device", "cpu", "--timing-budget", "0.05")


def cli(*args: str):
    """The real CLI in-process, with the review commands registered (as cli.py does)."""
    from appliance.cli import app
    from appliance.review_cli import register

    register(app)
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="session")
def real_run(tmp_path_factory) -> Path:
    """The database of run 1: softmax optimised by the tuner (3 evaluated candidates, all passing) plus a hand
    submission that fails to compile (candidate 4 or later, verdict compile_error). Made once per session even
    though two modules define this fixture (here and, imported, tests/test_review.py): the second finds it done."""
    home = tmp_path_factory.getbasetemp() / "real-run" / "home"
    if (home / "done").exists():
        return home / "appliance.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("APPLIANCE_HOME", str(home))
        mp.delenv("APPLIANCE_DB_URL", raising=False)
        mp.delenv("APPLIANCE_UNSAFE_NO_JAIL", raising=False)
        result = cli("optimize", SOFTMAX, "--max-candidates", "3", "--batch", "2", *FAST, "--json")
        assert result.exit_code == 0, result.stdout
        result = cli("submit", "1", candidate("compile_error"), "--json")
        assert result.exit_code == 1 and '"compile_error"' in result.stdout, result.stdout
    (home / "done").touch()
    return home / "appliance.db"


def copy_db(source: Path, target: Path) -> str:
    """A consistent copy through SQLite's backup API (the WAL's content included); returns its URL."""
    target.parent.mkdir(parents=True, exist_ok=True)
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return f"sqlite:///{target}"


@pytest.fixture
def db(real_run, tmp_path, monkeypatch) -> str:
    """URL of this test's own copy of the real run's database; APPLIANCE_HOME is its directory."""
    monkeypatch.setenv("APPLIANCE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("APPLIANCE_DB_URL", raising=False)
    return copy_db(real_run, tmp_path / "home" / "appliance.db")


@pytest.fixture
def store(db):
    from appliance.db import Store

    s = Store.open(db)
    yield s
    s.close()


@pytest.fixture
def make_app(store, db) -> Callable:
    from appliance.tui import Actions, ApplianceApp

    def make(**kwargs):
        return ApplianceApp(store, Actions(store, db), poll_s=kwargs.pop("poll_s", 0.2), **kwargs)

    return make


async def settle(pilot) -> None:
    """Let the screen's reads and actions (worker threads) finish and their results be drawn."""
    from textual.worker import WorkerCancelled, WorkerFailed

    await pilot.pause()
    # A finished read may start another (a screen drawn from its result loads its own data): wait until none is left.
    for _ in range(20):
        running = [worker for worker in pilot.app.workers if not worker.is_finished]
        if not running:
            break
        for worker in running:
            try:
                await worker.wait()
            except (WorkerCancelled, WorkerFailed):  # a read replaced by a newer one; an action's error is notified
                pass
        await pilot.pause()
    await pilot.pause()


async def until(pilot, condition: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.1)
        await settle(pilot)
