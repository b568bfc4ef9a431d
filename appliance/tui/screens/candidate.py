"""The candidate screen: what a reviewer needs before approving: the source, the diff against its parent, the gate's
evidence, the timings per shape and the compiler / runtime log; approve or reject it from here."""

from __future__ import annotations

from rich.syntax import Syntax
from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Header, Static, TabbedContent, TabPane

from appliance.tui.data import CandidateView, candidate_view
from appliance.tui.format import ms, percent, times
from appliance.tui.screens.base import PollingScreen
from appliance.tui.screens.run import ask_decision

TABS = [("source", "1 Source"), ("diff", "2 Diff vs parent"), ("evidence", "3 Gate evidence"),
        ("timings", "4 Timings"), ("log", "5 Compiler log")]


class CandidateScreen(PollingScreen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.quit", "Quit", show=False),  # (shown on the runs screen: here the keys below need room)
        # The tab titles show their keys (1 Source, 2 Diff...), so the footer need not.
        *(Binding(str(i), f"tab('{name}')", label, show=False) for i, (name, label) in enumerate(TABS, 1)),
        Binding("a", "approve", "Approve"),
        Binding("x", "reject", "Reject"),
    ]

    def __init__(self, candidate_id: int):
        super().__init__()
        self.candidate_id = candidate_id
        self.view: CandidateView | None = None
        self._shown_key: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("loading...", id="candidate-summary", markup=False)
        with TabbedContent(id="tabs"):
            for name, label in TABS:
                with TabPane(label, id=name):
                    with VerticalScroll():
                        yield Static("", id=f"{name}-body", markup=False)
        yield Footer(compact=True, show_command_palette=False)  # every key fits 80 columns (ctrl+p still opens it)

    def on_mount(self) -> None:
        self.sub_title = f"candidate {self.candidate_id}"
        super().on_mount()

    def load(self) -> CandidateView | None:
        return candidate_view(self.app.store, self.candidate_id)

    def show(self, view: CandidateView | None) -> None:
        if view is None:
            self.query_one("#candidate-summary", Static).update(f"no candidate {self.candidate_id}")
            return
        self.view = view
        c, e = view.candidate, view.evaluation
        # Only re-render when something changed: re-rendering resets nothing, but costs on a big source.
        key = (c.status, e.id if e else None, tuple(a.id for a in view.decisions), view.is_winner)
        if key == self._shown_key:
            return
        self._shown_key = key
        self.sub_title = f"candidate {c.id} of run {c.run_id}: {view.task}"
        decisions = "; ".join(f"{a.decision} by {a.who} {a.created_at:%m-%d %H:%M} UTC: {a.comment}"
                              for a in view.decisions) or "no decision yet"
        verdict = f"{e.verdict} at {e.stage}: {e.reason}" if e else c.status
        generation, island = ("-" if v is None else v for v in (c.generation, c.island))
        self.query_one("#candidate-summary", Static).update("\n".join([
            f"candidate {c.id}  run {c.run_id}  proposer {c.proposer}  parent {c.parent_id or '-'}  "
            f"generation {generation}  island {island}" + ("  WINNER" if view.is_winner else ""),
            f"verdict     {verdict}",
            f"speedup     {times(e.speedup_vs_eager if e else None)} vs eager, "
            f"{times(e.speedup_vs_compile if e else None)} vs torch.compile"
            + (f"   ({e.device}, {e.mode} sizes{', UNJAILED' if not e.jailed else ''})" if e else ""),
            f"note        {c.note or '-'}",
            f"review      {decisions}",
        ]))
        self.query_one("#source-body", Static).update(
            Syntax(c.source or "(no source)", "python", line_numbers=True, theme="ansi_dark", word_wrap=False))
        self.query_one("#diff-body", Static).update(
            Syntax(view.diff, "diff", theme="ansi_dark") if c.source else "(no source)")
        self.query_one("#evidence-body", Static).update(view.evidence)
        self.query_one("#timings-body", Static).update(_timings_table(view))
        self.query_one("#log-body", Static).update(view.log)

    def action_tab(self, name: str) -> None:
        self.query_one(TabbedContent).active = name

    def action_approve(self) -> None:
        self._decide("approve")

    def action_reject(self) -> None:
        self._decide("reject")

    def _decide(self, decision: str) -> None:
        e = self.view.evaluation if self.view else None
        context = (f"Candidate {self.candidate_id}: {e.verdict}, {times(e.speedup_vs_eager)} vs eager, "
                   f"{times(e.speedup_vs_compile)} vs torch.compile ({e.device})." if e else "Not evaluated.")
        ask_decision(self, self.candidate_id, decision, context)


def _timings_table(view: CandidateView) -> Table | str:
    if not view.timings:
        return "no timings (the candidate was not timed)"
    device = view.timings[0].device
    table = Table(title=f"median ms per call ± IQR ({'GPU' if device == 'cuda' else 'CPU timing'})", expand=False)
    for column in ("shape", "candidate", "eager", "torch.compile", "vs eager", "vs compile", "roofline", "mJ/call"):
        table.add_column(column, justify="left" if column == "shape" else "right")
    by_shape: dict[str, dict] = {}
    for t in view.timings:
        by_shape.setdefault(t.shape, {})[t.implementation] = t
    for shape, impls in by_shape.items():
        c, eager, comp = impls.get("candidate"), impls.get("eager"), impls.get("compile")

        def cell(t):
            if t is None:
                return "-"
            return "failed" if t.error else f"{ms(t.median_ms)} ±{ms(t.iqr_ms)}"

        def ratio(base):
            ok = base is not None and c is not None and base.median_ms and c.median_ms
            return times(base.median_ms / c.median_ms) if ok else "-"

        table.add_row(shape, cell(c), cell(eager), cell(comp), ratio(eager), ratio(comp),
                      percent(c.roofline_fraction if c else None),
                      f"{c.energy_j_per_call * 1e3:.3g}" if c and c.energy_j_per_call else "-")
    return table
