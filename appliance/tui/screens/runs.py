"""The runs screen: every run with its status, budget used, best speedup, GPU-hours, energy and review state."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Static

from appliance.tui.data import RunLine, runs_overview
from appliance.tui.format import energy, hours, times
from appliance.tui.screens.base import PollingScreen
from appliance.tui.screens.form import Field, FormScreen
from appliance.tui.widgets import LiveTable

COLUMNS = ["run", "task", "kind", "status", "budget used", "best vs eager", "GPU-h", "energy", "review",
           "created (UTC)"]


class RunsScreen(PollingScreen):
    BINDINGS = [
        Binding("n", "new_run", "New run"),
        Binding("p", "pause", "Pause"),
        Binding("r", "resume", "Resume"),
        Binding("s", "stop", "Stop"),
        Binding("b", "budget", "Budget"),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        yield LiveTable(COLUMNS, id="runs")
        yield Static("", id="runs-hint")
        yield Footer(compact=True, show_command_palette=False)  # every key fits 80 columns (ctrl+p still opens it)

    def on_mount(self) -> None:
        self.sub_title = "runs"
        super().on_mount()

    def load(self) -> list[RunLine]:
        return runs_overview(self.app.store)

    def show(self, lines: list[RunLine]) -> None:
        self.query_one(LiveTable).update_rows([(str(r.id), (
            str(r.id), r.task, r.kind, r.status,
            f"{r.evaluated}/{r.budget}" if r.budget else str(r.evaluated), times(r.best), hours(r.gpu_hours),
            energy(r.energy_j), r.review, f"{r.created_at:%m-%d %H:%M}")) for r in lines])
        running = sum(1 for r in lines if r.status == "running")
        queued = sum(1 for r in lines if r.status == "queued")
        self.query_one("#runs-hint", Static).update(
            f"{len(lines)} runs, {running} running, {queued} queued for `appliance controller`. Enter opens a "
            "run; resume queues it for the controller.")

    def current_run_id(self) -> int | None:
        key = self.query_one(LiveTable).selected_key()
        return int(key) if key is not None else None

    @on(DataTable.RowSelected)
    def action_open(self) -> None:
        from appliance.tui.screens.run import RunScreen

        if (run_id := self.current_run_id()) is not None:
            self.app.push_screen(RunScreen(run_id))

    def action_new_run(self) -> None:
        fields = [Field("task", "task file (KernelBench format)", placeholder="benchmarks/tasks/softmax.py"),
                  Field("start_from", "seed candidate (empty: the bundled baseline, else torch.compile's kernels)",
                        placeholder="my_kernel.py"),
                  Field("max_candidates", "max candidates", "20"),
                  Field("proposer", "proposer: tune or llm (empty: llm when an endpoint is configured)")]
        self.ask(FormScreen("New optimize run", fields, lambda values: self.app.actions.new_run(*values.values()),
                            "Queued for `appliance controller`, as `appliance optimize TASK --queue`.",
                            submit="Queue"))
