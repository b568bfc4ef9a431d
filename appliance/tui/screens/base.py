"""What every screen shares: polling the database in a worker thread, running actions in worker threads and
showing their result or error, and the run controls (pause, resume, stop, budget) of the runs and run screens."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from textual import on
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from appliance.errors import ApplianceError
from appliance.tui.actions import BUDGETS
from appliance.tui.screens.form import ConfirmScreen, Field, FormScreen

if TYPE_CHECKING:
    from appliance.tui.app import ApplianceApp


class PollingScreen(Screen):
    app: ApplianceApp

    def load(self) -> Any:
        """Read what the screen shows (runs in a worker thread)."""
        raise NotImplementedError

    def show(self, data: Any) -> None:
        """Lay out what load() read (runs on the UI thread)."""
        raise NotImplementedError

    def on_mount(self) -> None:
        self.reload()
        self.set_interval(self.app.poll_s, self.reload)

    def on_screen_resume(self) -> None:
        self.reload()

    def reload(self) -> None:
        if self.app.screen is self:  # screens under a dialog or another screen wait their turn
            self.run_worker(self.load, thread=True, exclusive=True, group="load", exit_on_error=False)

    def act(self, action: Callable[..., str], *args: Any) -> None:
        """Run an action off the UI thread; its line (or error) appears as a notification, then the screen reloads."""
        self.run_worker(partial(action, *args), thread=True, group="action", exit_on_error=False)

    @on(Worker.StateChanged)
    def _worker_done(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if worker.state == WorkerState.SUCCESS:
            if worker.group == "load":
                self.show(worker.result)
            else:
                self.notify(worker.result, timeout=6, markup=False)
                self.reload()
        elif worker.state == WorkerState.ERROR:
            error = worker.error
            message = str(error) if isinstance(error, ApplianceError) else f"{type(error).__name__}: {error}"
            self.notify(message, severity="error", timeout=10, markup=False)

    # --- run controls (the runs screen acts on the highlighted run, the run screen on its run) ---

    def current_run_id(self) -> int | None:
        return None

    def _with_run(self, action: Callable[[int], str]) -> None:
        run_id = self.current_run_id()
        if run_id is None:
            self.notify("no run selected", severity="warning")
        else:
            self.act(action, run_id)

    def action_pause(self) -> None:
        self._with_run(self.app.actions.pause)

    def action_resume(self) -> None:
        self._with_run(self.app.actions.resume)

    def action_stop(self) -> None:
        run_id = self.current_run_id()
        if run_id is None:
            self.notify("no run selected", severity="warning")
            return
        self.app.push_screen(ConfirmScreen(f"Stop run {run_id}? It finishes the evaluation in flight, then stops "
                                           "(resume continues it)."),
                             lambda yes: yes and self.act(self.app.actions.stop, run_id))

    def ask(self, form: FormScreen) -> None:
        """A dialog whose action's line, once done, is shown like any action's (errors stay in the dialog)."""
        self.app.push_screen(form, self._after_form)

    def _after_form(self, line: str | None) -> None:
        if line:
            self.notify(line, timeout=6, markup=False)
            self.reload()

    def action_budget(self) -> None:
        run_id = self.current_run_id()
        if run_id is None:
            return
        run = self.app.store.get_run(run_id)
        config = run.config or {}
        labels = {"max_candidates": "max candidates (evaluated, seed included)", "max_gpu_seconds":
                  "max GPU seconds (empty: no limit)", "max_wall_s": "max wall seconds (empty: no limit)",
                  "max_tokens": "max LLM tokens (empty: no limit)"}
        fields = [Field(n, labels[n], "" if config.get(n) is None else f"{config[n]:g}") for n in BUDGETS]
        self.ask(FormScreen(f"Budget of run {run_id}", fields, partial(self.app.actions.set_budget, run_id),
                            "A run in progress takes the new budget at once."))
