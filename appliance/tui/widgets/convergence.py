"""The best speedup over evaluations: a sparkline with its numbers beside it (it reads the same over plain SSH)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static


class Convergence(Vertical):
    DEFAULT_CSS = """
    Convergence { height: auto; }
    Convergence Sparkline { height: 3; }
    """

    def compose(self) -> ComposeResult:
        yield Static("convergence: no evaluations yet", id="convergence-label")
        yield Sparkline([], id="convergence-plot")

    def show(self, points: list[float]) -> None:
        if points:
            first = next((p for p in points if p > 0), 0.0)
            label = (f"best speedup vs eager over {len(points)} evaluations: "
                     f"{first:.3g}x at first pass -> {points[-1]:.3g}x now" if first else
                     f"{len(points)} evaluations, none passed yet")
            self.query_one("#convergence-label", Static).update(label)
        self.query_one("#convergence-plot", Sparkline).data = points
