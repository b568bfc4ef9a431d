"""The run screen: the live leaderboard, the convergence of the best speedup, counts per verdict, workers and GPU,
token rate; the run controls, submitting a file, and approving or rejecting the winner."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Footer, Header, Static

from appliance.proposers.mix import describe
from appliance.tui.data import RunView, run_view
from appliance.tui.format import energy, hours, ms, percent, times, verdict_style
from appliance.tui.screens.base import PollingScreen
from appliance.tui.screens.form import Field, FormScreen
from appliance.tui.widgets import Convergence, LiveTable

COLUMNS = ["cand", "proposer", "verdict", "ms (main)", "vs eager", "vs compile", "roofline", "gen", "review", "note"]


class RunScreen(PollingScreen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.quit", "Quit", show=False),  # (shown on the runs screen: here the keys below need room)
        Binding("w", "winner", "Winner"),
        Binding("a", "approve", "Approve"),
        Binding("x", "reject", "Reject"),
        Binding("f", "submit", "Submit"),
        Binding("p", "pause", "Pause"),
        Binding("r", "resume", "Resume"),
        Binding("s", "stop", "Stop"),
        Binding("b", "budget", "Budget"),
    ]

    def __init__(self, run_id: int):
        super().__init__()
        self.run_id = run_id
        self.view: RunView | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="run-top"):
            yield Static("loading...", id="run-summary", markup=False)
            with Vertical(id="run-side"):
                yield Static("", id="run-verdicts", markup=False)
                yield Convergence()
        yield LiveTable(COLUMNS, id="leaderboard")
        yield Footer(compact=True, show_command_palette=False)  # every key fits 80 columns (ctrl+p still opens it)

    def on_mount(self) -> None:
        self.sub_title = f"run {self.run_id}"
        super().on_mount()

    def load(self) -> RunView | None:
        return run_view(self.app.store, self.run_id)

    def show(self, view: RunView | None) -> None:
        if view is None:
            self.query_one("#run-summary", Static).update(f"no run {self.run_id}")
            return
        self.view = view
        self.sub_title = f"run {view.run.id}: {view.task}"
        run, config = view.run, view.run.config or {}
        won = view.winner
        winner_line = ("-" if won is None else
                       f"candidate {won.candidate.id} ({won.candidate.proposer}), "
                       f"{times(won.evaluation.speedup_vs_eager)} vs eager, "
                       + (f"APPROVED by {won.approval.who}" if won.approved else "not approved yet"))
        budget = f"{view.evaluated} / {view.budget} candidates" if view.budget else f"{view.evaluated} evaluated"
        limits = ", ".join(f"{label} {config[key]:g}" for key, label in (
            ("max_gpu_seconds", "GPU s"), ("max_wall_s", "wall s"), ("max_tokens", "tokens")) if config.get(key))
        workers = f"{config.get('workers') or 'default'} in flight on {config.get('device', 'auto')}"
        used = [f"{u.host} GPU {u.gpu}: {u.evaluations} evaluated, {u.gpu_seconds:.0f} GPU-s, {energy(u.energy_j)}"
                for u in view.workers_used]
        rate = f"{view.token_rate:.1f}/s" if view.token_rate else "-"
        lines = [
            f"{view.task}  run {run.id} ({run.kind})  status {run.status.upper()}",
            f"budget used   {budget}" + (f" ({limits})" if limits else ""),
            f"in flight     {', '.join(map(str, view.in_flight)) or '-'}   queued {view.queued}",
            f"workers       {workers}",
            *(f"              {line}" for line in used),
            f"device        {view.gpu}",
            f"GPU-hours     {hours(view.gpu_hours)}   energy {energy((run.state or {}).get('energy_j'))}",
            f"LLM tokens    {view.tokens}   rate {rate}",
            f"proposers     {config.get('proposer', '-')}   seed {config.get('seed', '-')}",
            *(f"              {describe(y, 'GPU-s' if view.on_gpu else 'CPU-s')}" for y in view.proposer_yields),
            f"winner        {winner_line}",
        ]
        self.query_one("#run-summary", Static).update("\n".join(lines))
        self.query_one("#run-verdicts", Static).update(
            "verdicts  " + ("  ".join(f"{v} {n}" for v, n in view.verdicts.items()) or "-"))
        self.query_one(Convergence).show(view.convergence)
        self.query_one(LiveTable).update_rows([(str(r.candidate_id), (
            str(r.candidate_id), r.proposer, Text(r.verdict, style=verdict_style(r.verdict)), ms(r.ms),
            times(r.vs_eager), times(r.vs_compile),
            percent(r.roofline), "-" if r.generation is None else str(r.generation), r.decision or "-",
            r.note[:48])) for r in view.leaderboard])

    def current_run_id(self) -> int | None:
        return self.run_id

    @on(DataTable.RowSelected)
    def action_open(self) -> None:
        key = self.query_one(LiveTable).selected_key()
        if key is not None:
            self._open(int(key))

    def action_winner(self) -> None:
        if self.view and self.view.winner:
            self._open(self.view.winner.candidate.id)
        else:
            self.notify("no candidate has passed the gate yet", severity="warning")

    def _open(self, candidate_id: int) -> None:
        from appliance.tui.screens.candidate import CandidateScreen

        self.app.push_screen(CandidateScreen(candidate_id))

    def action_approve(self) -> None:
        self._decide("approve")

    def action_reject(self) -> None:
        self._decide("reject")

    def _decide(self, decision: str) -> None:
        won = self.view.winner if self.view else None
        if won is None:
            self.notify("no winner to review: no candidate has passed the gate", severity="warning")
            return
        ask_decision(self, won.candidate.id, decision,
                     f"Winner of run {self.run_id}: candidate {won.candidate.id} ({won.candidate.proposer}), "
                     f"{won.evaluation.verdict}, {times(won.evaluation.speedup_vs_eager)} vs eager, "
                     f"{times(won.evaluation.speedup_vs_compile)} vs torch.compile. 'w' shows its source, diff "
                     "and evidence.")

    def action_submit(self) -> None:
        self.ask(FormScreen(f"Submit a candidate to run {self.run_id}", [Field("path", "candidate file (defines "
                                                                               "ModelNew)")],
                            lambda values: self.app.actions.submit(self.run_id, values["path"]),
                            "Queued in the run and evaluated by the process running it.", submit="Submit"))


def ask_decision(screen: PollingScreen, candidate_id: int, decision: str, context: str) -> None:
    """The approve / reject dialog; the decision is recorded with the OS user and the comment."""
    verb = "Approve" if decision == "approve" else "Reject"
    screen.ask(FormScreen(f"{verb} candidate {candidate_id}", [Field("comment", "comment (why; required)")],
                          lambda values: screen.app.actions.decide(candidate_id, decision, values["comment"]),
                          context, submit=verb))
