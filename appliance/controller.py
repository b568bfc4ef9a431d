"""The controller daemon's queue: claim queued optimize runs one after another, run each, and give runs whose
controller is gone back to the queue. `appliance controller` (cli.py) wires it to the workers, the metrics and the
optimizer; this module holds what the daemon decides."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable

from appliance.config import Settings
from appliance.errors import ApplianceError


def controller_id() -> str:
    """Who runs a run: host and process, recorded in the run's state (requeue_orphaned_runs reads it)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def serve_queue(store, stop: threading.Event, poll: float, run_one: Callable[[object], str],
                log: Callable[[str], None]) -> None:
    """Until `stop`: claim the oldest queued run (another controller may take it first), mark it as this
    controller's, and run it with `run_one(run)` (which returns the run's final status). A run that fails on a
    broken task or host is marked failed; the daemon goes on. With nothing queued, requeue orphaned runs and wait."""
    while not stop.is_set():
        queued = store.runs_with_status("queued")
        if not queued:
            for run_id in requeue_orphaned_runs(store):  # e.g. another host's controller died
                log(f"run {run_id}: its controller is gone; queued again")
            stop.wait(poll)
            continue
        run = queued[0]
        if not store.claim_run(run.id):
            continue  # another controller took it first
        store.update_run(run.id, state=(run.state or {}) | {"controller": controller_id()})
        try:
            log(f"run {run.id}: {run_one(run)}")
        except ApplianceError as e:  # a broken task or host fails this run, not the controller
            store.update_run(run.id, status="failed")
            log(f"run {run.id} failed: {e}")


def requeue_orphaned_runs(store, stale_s: float | None = None) -> list[int]:
    """Runs left `running` by a controller that is gone go back to the queue: on this host, a controller whose
    process is gone; on another host (several controllers may share one database), one whose run has not beaten its
    heartbeat (loop.py, about every second) for `stale_s` (APPLIANCE_CONTROLLER_STALE_S, default 600: an LLM request
    may hold the loop for minutes; hosts' clocks are assumed NTP-synchronised)."""
    if stale_s is None:
        stale_s = Settings.load().controller_stale_s
    requeued = []
    for run in store.runs_with_status("running"):
        if not run.config.get("controller"):
            continue  # an `appliance optimize` in a terminal: --resume is the user's call
        state = run.state or {}
        host, _, pid = str(state.get("controller", "")).rpartition(":")
        if host and host != socket.gethostname():
            if time.time() - float(state.get("heartbeat") or time.time()) > stale_s:
                store.update_run(run.id, status="queued")
                requeued.append(run.id)
            continue
        try:
            os.kill(int(pid), 0)
            alive = int(pid) != os.getpid()
        except (ProcessLookupError, ValueError):  # gone, or no record of who ran it
            alive = False
        except PermissionError:  # a live process of another user
            alive = True
        if not alive:
            store.update_run(run.id, status="queued")
            requeued.append(run.id)
    return requeued
