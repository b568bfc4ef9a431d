"""The search: an evolutionary database over a run's candidates (database.py) and the loop that feeds it (loop.py)."""
