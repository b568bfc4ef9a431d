"""`appliance tui`: steer runs and review winners from a terminal (works over plain SSH; the mouse is optional).

The app is built from the objects it is given (a Store to read, Actions to write), so tests hand it a real
database file. Screens poll the database every `poll_s` seconds: a run progressing in another process (the
controller, `appliance optimize`) shows up live."""

from __future__ import annotations

from textual.app import App
from textual.binding import Binding

from appliance.db import Store
from appliance.tui.actions import Actions
from appliance.tui.screens import RunScreen, RunsScreen


class ApplianceApp(App):
    TITLE = "Kernel Optimizer Appliance"
    CSS_PATH = "app.tcss"
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("ctrl+c", "quit", "Quit", show=False)]

    def __init__(self, store: Store, actions: Actions, poll_s: float = 1.0, run_id: int | None = None):
        super().__init__()
        self.store, self.actions, self.poll_s, self.start_run = store, actions, poll_s, run_id

    def on_mount(self) -> None:
        self.push_screen(RunsScreen())
        if self.start_run is not None:
            self.push_screen(RunScreen(self.start_run))
