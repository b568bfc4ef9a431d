"""The TUI driven by Textual's pilot against a real database filled by a real run (tests/tui/conftest.py): keys,
actions and what they write, and live updates from other processes (a writer, then a real controller)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from textual.widgets import Static, TabbedContent

from appliance.review import current_user, winner
from appliance.tui.screens import CandidateScreen, FormScreen, RunScreen, RunsScreen
from appliance.tui.widgets import LiveTable
from tests.conftest import REPO
from tests.tui.conftest import SOFTMAX, settle, until

SIZE = (120, 36)
pytestmark = pytest.mark.anyio


def cells(app) -> list[list[str]]:
    table = app.screen.query_one(LiveTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def text(app, selector: str) -> str:
    """What a Static shows, as plain text (a Rich renderable rendered)."""
    content = app.screen.query_one(selector, Static).content
    if isinstance(content, str):
        return content
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(content)
    return console.file.getvalue()


def spy_notifications(app) -> list[str]:
    seen, notify = [], app.notify

    def record(message, **kw):
        seen.append(message)
        notify(message, **kw)

    app.notify = record
    return seen


async def type_text(pilot, value: str) -> None:
    await pilot.press(*value)


async def test_runs_screen_then_run_then_candidates_by_keys(make_app, store):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, RunsScreen)
        run_row = cells(app)[0]
        assert run_row[:4] == ["1", "softmax", "optimize", "finished"] and run_row[4] == "4/3"
        assert run_row[8] == "-"  # nobody reviewed it yet

        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, RunScreen) and app.screen.run_id == 1
        board = cells(app)
        assert [r[2] for r in board].count("pass") == 3 and "compile_error" in [r[2] for r in board]
        assert board[0][2] == "pass" and board[0][4].endswith("x")  # the best first, with its speedup
        assert "pass 3" in text(app, "#run-verdicts") and "compile_error 1" in text(app, "#run-verdicts")
        assert "over 4 evaluations" in text(app, "#convergence-label")
        assert "status FINISHED" in text(app, "#run-summary") and "4 / 3 candidates" in text(app, "#run-summary")

        await pilot.press("w")  # the winner's evidence
        await settle(pilot)
        best = winner(store, 1)
        assert isinstance(app.screen, CandidateScreen) and app.screen.candidate_id == best.candidate.id
        assert "WINNER" in text(app, "#candidate-summary")
        await pilot.press("2")
        assert app.screen.query_one(TabbedContent).active == "diff"
        await pilot.press("3")
        evidence = text(app, "#evidence-body")
        assert "pass on seeds 0, 1, 2" in evidence  # the timed calls: checked in secret, counted per row
        # Sections as tables of names and values, not JSON: nested objects get dotted names.
        assert "{" not in evidence and "launches_per_call" in evidence and "limits." in evidence, evidence

        await pilot.press("escape")  # back to the run; open the candidate that failed to compile
        await settle(pilot)
        failed = next(i for i, r in enumerate(cells(app)) if r[2] == "compile_error")
        app.screen.query_one(LiveTable).move_cursor(row=failed)
        await pilot.press("enter")
        await settle(pilot)
        assert "compile_error" in text(app, "#candidate-summary")
        await pilot.press("5")
        assert app.screen.query_one(TabbedContent).active == "log"
        assert "power of 2" in text(app, "#log-body") or "arange" in text(app, "#log-body")

        await pilot.press("escape", "escape")
        await settle(pilot)
        assert isinstance(app.screen, RunsScreen)


async def test_approving_the_winner_records_who_when_and_why(make_app, store):
    app = make_app(run_id=1)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("a")
        assert isinstance(app.screen, FormScreen)
        await type_text(pilot, "fastest on every shape; diff reviewed")
        await pilot.press("enter")
        await settle(pilot)
        [approval] = store.approvals(1)
        best = winner(store, 1)
        assert (approval.decision, approval.candidate_id) == ("approve", best.candidate.id)
        assert approval.who == current_user()
        assert approval.comment == "fastest on every shape; diff reviewed" and approval.created_at is not None
        assert best.approved
        assert f"APPROVED by {current_user()}" in text(app, "#run-summary")
        assert cells(app)[0][8] == "approve"

        await pilot.press("escape")
        await settle(pilot)
        assert cells(app)[0][8] == "approved"


async def test_a_decision_needs_a_comment_and_only_a_passing_candidate_is_approved(make_app, store):
    app = make_app(run_id=1)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("x", "enter")  # reject with an empty comment: refused in the dialog, which stays open
        await settle(pilot)
        await until(pilot, lambda: "needs a comment" in text(app, "#form-error"), what="the refusal in the dialog")
        assert store.approvals(1) == [] and isinstance(app.screen, FormScreen)
        await pilot.press("escape")
        await settle(pilot)

        failed = next(i for i, r in enumerate(cells(app)) if r[2] == "compile_error")
        app.screen.query_one(LiveTable).move_cursor(row=failed)
        await pilot.press("enter")
        await settle(pilot)
        await pilot.press("a")
        await type_text(pilot, "ship it")
        await pilot.press("enter")
        await settle(pilot)
        await until(pilot, lambda: "cannot be approved: compile_error" in text(app, "#form-error"),
                    what="the refusal in the dialog")
        assert store.approvals(1) == [] and app.screen.query_one("#field-comment").value == "ship it"  # kept
        await pilot.press("escape")
        await settle(pilot)
        await pilot.press("x")
        await type_text(pilot, "does not compile")
        await pilot.press("enter")
        await settle(pilot)
        assert [(a.decision, a.comment) for a in store.approvals(1)] == [("reject", "does not compile")]


async def test_pause_resume_stop_and_budget_from_the_runs_screen(make_app, store):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        seen = spy_notifications(app)
        await settle(pilot)
        statuses = []
        await pilot.press("s")  # stop asks first: no leaves the run as it is
        await settle(pilot)
        await pilot.press("n")
        await settle(pilot)
        assert store.get_run(1).status == "finished" and isinstance(app.screen, RunsScreen)
        for key in ("r", "p", "r", "s"):
            await pilot.press(key)
            await settle(pilot)
            if key == "s":
                await pilot.press("y")  # yes, stop it
                await settle(pilot)
            statuses.append(store.get_run(1).status)
        # Resume queues the run for `appliance controller`; pause and stop are what `appliance pause/stop` set.
        assert statuses == ["queued", "paused", "queued", "stopped"]
        assert cells(app)[0][3] == "stopped"
        await pilot.press("p")
        await settle(pilot)
        assert store.get_run(1).status == "stopped" and any("cannot become paused" in m for m in seen)

        await pilot.press("b")
        assert isinstance(app.screen, FormScreen)
        await pilot.press("backspace", "8", "enter", "1", "2", "0", "enter", "enter", "enter")
        await settle(pilot)
        config = store.get_run(1).config
        assert config["max_candidates"] == 8 and config["max_gpu_seconds"] == 120.0 and config["max_tokens"] is None
        assert cells(app)[0][4] == "4/8"


async def test_submitting_a_file_queues_it_and_requeues_the_finished_run(make_app, store):
    app = make_app(run_id=1)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("f")
        await type_text(pilot, str(REPO / "benchmarks/baselines/softmax.py"))
        await pilot.press("enter")
        await settle(pilot)
        submitted = store.run_candidates(1)[-1][0]
        assert (submitted.proposer, submitted.status, submitted.note) == ("manual", "queued",
                                                                          "submitted by hand: softmax.py")
        run = store.get_run(1)
        assert run.status == "queued" and run.config["max_candidates"] == 5  # 4 evaluated + this one
        assert [submitted.id, "manual", "queued"] == [int(cells(app)[3][0]), *cells(app)[3][1:3]]


async def test_the_leaderboard_follows_rows_written_by_another_process(make_app, store, db):
    app = make_app(run_id=1)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert len(cells(app)) == 4
        # Another process adds a passing candidate faster than anything so far, as a worker would.
        writer = (
            "import sys\n"
            "from appliance.db import Store\n"
            "s = Store.open(sys.argv[1])\n"
            "c = s.add_candidate(1, 1, 'class ModelNew: ...', proposer='llm', status='evaluating', note='from afar')\n"
            "s.add_evaluation(c.id, 1, verdict='pass', stage='done', jailed=True, device='cpu', mode='small',\n"
            "                 speedup_vs_eager=99.0, timings=[{'shape': 'main', 'implementation': 'candidate',\n"
            "                 'device': 'cpu', 'median_ms': 0.5, 'iqr_ms': 0.01}])\n")
        subprocess.run([sys.executable, "-c", writer, db], check=True, cwd=REPO, timeout=120)
        await until(pilot, lambda: cells(app)[0][1] == "llm", what="the new best at the top of the leaderboard")
        assert cells(app)[0][2:5] == ["pass", "0.5", "99x"] and cells(app)[0][9] == "from afar"
        assert "pass 4" in text(app, "#run-verdicts") and "-> 99x now" in text(app, "#convergence-label")


async def test_a_new_run_for_a_missing_task_says_why(make_app, store):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        seen = spy_notifications(app)
        await settle(pilot)
        await pilot.press("n")
        await type_text(pilot, "no/such/task.py")
        await pilot.press("enter", "enter", "enter", "enter")
        await until(pilot, lambda: "no such task file" in text(app, "#form-error"), timeout=60, what="the error")
        assert len(store.list_runs()) == 1 and not seen  # said in the dialog, which stays open with the input
        assert app.screen.query_one("#field-task").value == "no/such/task.py"


@pytest.mark.slow
async def test_a_new_run_made_in_the_tui_progresses_live_under_the_controller(make_app, store, db, tmp_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("n")
        await type_text(pilot, str(SOFTMAX))
        await pilot.press("enter", "enter", "backspace", "backspace", "2", "enter", "t", "u", "n", "e", "enter")
        # The dialog closes once the run is made (it stays open on an error); then the runs screen shows it.
        await until(pilot, lambda: isinstance(app.screen, RunsScreen) and len(cells(app)) == 2, timeout=120,
                    what="the queued run on the runs screen")
        assert cells(app)[0][:4] == ["2", "softmax", "optimize", "queued"]
        run = store.get_run(2)
        assert run.config["max_candidates"] == 2 and run.config["proposer"] == "tune"

        # The appliance's daemon, in its own process, picks the run up; the run screen shows its progress live.
        await pilot.press("up", "enter")  # the highlight stayed on run 1 when run 2 appeared above it
        await settle(pilot)
        assert app.screen.run_id == 2
        env = os.environ | {"APPLIANCE_HOME": str(tmp_path / "home")}
        controller = subprocess.Popen([sys.executable, "-m", "appliance", "--db", db, "controller", "--metrics-port",
                                       "0", "--poll", "0.2"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            seen_running = []
            await until(pilot, lambda: seen_running.append("RUNNING" in text(app, "#run-summary")) or
                        "FINISHED" in text(app, "#run-summary"), timeout=240, what="the run to finish")
        finally:
            os.killpg(controller.pid, signal.SIGTERM)
            controller.wait(timeout=60)
        assert any(seen_running)  # seen while it ran, not only once it was done
        assert [r[2] for r in cells(app)].count("pass") == 2 and "2 / 2 candidates" in text(app, "#run-summary")


def test_appliance_tui_runs_in_a_terminal_and_quits_on_q(db):
    """The real command in a pseudo-terminal, as over SSH: it draws the runs screen and `q` quits."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 36, 120, 0, 0))
    command = "from appliance.cli import app; from appliance.review_cli import register; register(app); app()"
    tui = subprocess.Popen([sys.executable, "-c", command, "--db", db, "tui"], stdin=slave, stdout=slave,
                           stderr=slave, cwd=REPO, env=os.environ | {"TERM": "xterm-256color"}, start_new_session=True)
    os.close(slave)
    try:
        screen, deadline = b"", time.monotonic() + 60
        while not (b"softmax" in screen and b"finished" in screen) and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                screen += os.read(master, 65536)
        assert b"softmax" in screen and b"finished" in screen
        os.write(master, b"q")
        # Keep reading while it quits: a full pty buffer would block its last redraw and the exit with it.
        deadline = time.monotonic() + 60
        while tui.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    os.read(master, 65536)
                except OSError:  # the slave side closed as it exited
                    break
        assert tui.wait(timeout=10) == 0
    finally:
        if tui.poll() is None:
            os.killpg(tui.pid, signal.SIGKILL)
        os.close(master)


def test_the_run_view_sums_evaluations_gpu_seconds_and_energy_per_host_and_gpu():
    from appliance.db.models import Evaluation
    from appliance.tui.data import worker_use

    def evaluation(host, gpu, held, joules):
        return Evaluation(candidate_id=1, run_id=1, verdict="pass", stage="done", reason="", jailed=True,
                          device="cuda" if gpu is not None else "cpu", mode="full", environment={"hostname": "ctl"},
                          details={"gpu_index": gpu, "host": host, "device_turns": {"held_s": held, "joules": joules}})

    uses = worker_use([evaluation("gpu-b/77", 1, 2.0, 500.0), evaluation("gpu-a/12", 0, 1.0, 300.0),
                       evaluation("gpu-b/77", 1, 3.0, 700.0), evaluation(None, 0, 1.5, 100.0),
                       evaluation(None, None, 0.0, 0.0)])  # the last one ran on a CPU: no GPU to charge
    assert [(u.host, u.gpu, u.evaluations, u.gpu_seconds, u.energy_j) for u in uses] == [
        ("ctl", 0, 1, 1.5, 100.0), ("gpu-a/12", 0, 1, 1.0, 300.0), ("gpu-b/77", 1, 2, 5.0, 1200.0)]
