"""`python -m appliance` = the `appliance` command (for hosts where the console script is not on PATH)."""

from appliance.cli import app

app(prog_name="appliance")
