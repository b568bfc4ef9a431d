"""Reusable widgets of the TUI."""

from appliance.tui.widgets.convergence import Convergence
from appliance.tui.widgets.live_table import LiveTable

__all__ = ["Convergence", "LiveTable"]
