"""What an operator can do from the TUI. Each action is a change in the database that the process running the run
notices (the loop reads its run's status between evaluations), so the TUI never runs a search or an evaluation
itself: closing the SSH session loses nothing. Each returns a line for the screen or raises ApplianceError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from appliance.db import Store
from appliance.errors import ApplianceError
from appliance.review import decide

PAUSABLE = ("created", "queued", "running")
RESUMABLE = ("paused", "stopped", "finished", "failed")
STOPPABLE = ("created", "queued", "running", "paused")
BUDGETS = ("max_candidates", "max_gpu_seconds", "max_wall_s", "max_tokens")


class Actions:
    def __init__(self, store: Store, db_url: str, who: str | None = None):
        self.store, self.db_url, self.who = store, db_url, who

    def pause(self, run_id: int) -> str:
        return self._move(run_id, PAUSABLE, "paused")

    def resume(self, run_id: int) -> str:
        # Queued, the run is continued by `appliance controller` (or by `appliance optimize --resume RUN`).
        return self._move(run_id, RESUMABLE, "queued") + " (the controller continues it)"

    def stop(self, run_id: int) -> str:
        return self._move(run_id, STOPPABLE, "stopped")

    def _move(self, run_id: int, allowed: tuple[str, ...], status: str) -> str:
        run = self._optimize_run(run_id)
        if run.status not in allowed:
            raise ApplianceError(f"run {run_id} is {run.status}: it cannot become {status}")
        self.store.update_run(run_id, status=status)
        return f"run {run_id}: {status}"

    def set_budget(self, run_id: int, budgets: dict[str, str]) -> str:
        """Budgets as typed in the form: a number, or empty for no limit (max_candidates always has one).
        A run in progress reads its budget from the database before each step: the change applies at once."""
        run = self._optimize_run(run_id)
        config = dict(run.config or {})
        for name in BUDGETS:
            text = (budgets.get(name) or "").strip()
            try:
                value = (int(text) if name in ("max_candidates", "max_tokens") else float(text)) if text else None
            except ValueError:
                raise ApplianceError(f"{name}: {text!r} is not a number") from None
            if (value is not None and value <= 0) or (name == "max_candidates" and value is None):
                raise ApplianceError(f"{name} must be a positive number" + ("" if name == "max_candidates" else
                                                                              " or empty for no limit"))
            config[name] = value
        self.store.update_run(run_id, config=config)
        return f"run {run_id}: budget {config['max_candidates']} candidates" + "".join(
            f", {n.removeprefix('max_')} {config[n]:g}" for n in BUDGETS[1:] if config.get(n) is not None)

    def submit(self, run_id: int, path: str) -> str:
        """Queue a person's candidate in the run, like `appliance submit` but evaluated by the process running the
        run. A finished run is queued again, its budget raised to make room, so the controller evaluates it."""
        run = self._optimize_run(run_id)
        file = Path(path).expanduser()
        if not file.is_file():
            raise ApplianceError(f"no such candidate file: {file}")
        candidate = self.store.add_candidate(run_id, run.task_id, file.read_text(errors="replace"),
                                             path=str(file.resolve()), proposer="manual", status="queued", island=0,
                                             note=f"submitted by hand: {file.name}")
        if run.status == "finished":
            config = dict(run.config or {})
            rows = self.store.run_candidates(run_id)
            # Room for every candidate still waiting (this one and any left from the last generation).
            wanted = sum(1 for c, e in rows if e is not None or c.status == "queued")
            config["max_candidates"] = max(int(config.get("max_candidates") or 0), wanted)
            self.store.update_run(run_id, status="queued", config=config)
            return f"candidate {candidate.id} queued; run {run_id} queued again to evaluate it"
        return f"candidate {candidate.id} queued in run {run_id} ({run.status})"

    def new_run(self, task: str, start_from: str = "", max_candidates: str = "", proposer: str = "") -> str:
        """Create a queued optimize run through `appliance optimize --queue`, the one code path that validates the
        task and picks the seed candidate, run as a child process so this stays the same as the command line."""
        if not task.strip():
            raise ApplianceError("give a task file")
        command = [sys.executable, "-m", "appliance", "optimize", task.strip(), "--queue", "--json"]
        for flag, value in (("--from", start_from), ("--max-candidates", max_candidates), ("--proposer", proposer)):
            if value.strip():
                command += [flag, value.strip()]
        # The URL through the environment, not argv: it may hold a password.
        done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              env=os.environ | {"APPLIANCE_DB_URL": self.db_url})
        lines = done.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            answer = {}
        if done.returncode != 0 or "run_id" not in answer:
            raise ApplianceError(answer.get("error") or (done.stderr.strip() or done.stdout.strip())[-500:])
        return f"run {answer['run_id']} queued for the controller"

    def decide(self, candidate_id: int, decision: str, comment: str) -> str:
        approval = decide(self.store, candidate_id, decision, comment, self.who)
        done = {"approve": "approved", "reject": "rejected"}[decision]
        return f"candidate {candidate_id}: {done} by {approval.who}"

    def _optimize_run(self, run_id: int):
        run = self.store.get_run(run_id)
        if run is None:
            raise ApplianceError(f"no run {run_id}")
        if run.kind != "optimize":
            raise ApplianceError(f"run {run_id} is an {run.kind} run: only optimize runs are steered")
        return run
