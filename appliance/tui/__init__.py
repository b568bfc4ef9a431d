"""The terminal UI (Textual): runs, a run's live leaderboard, a candidate's evidence; steering and review."""

from appliance.tui.actions import Actions
from appliance.tui.app import ApplianceApp

__all__ = ["Actions", "ApplianceApp"]
