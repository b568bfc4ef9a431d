"""The TUI's screens: runs -> run -> candidate, and the form dialog the actions use."""

from appliance.tui.screens.candidate import CandidateScreen
from appliance.tui.screens.form import FormScreen
from appliance.tui.screens.run import RunScreen
from appliance.tui.screens.runs import RunsScreen

__all__ = ["CandidateScreen", "FormScreen", "RunScreen", "RunsScreen"]
