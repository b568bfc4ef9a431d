"""Settings: every environment variable the appliance reads is read in appliance/config.py, with its default and a
clear error for a value that is no number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from appliance.config import Settings
from appliance.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_timeouts_and_the_llm_gpu_come_from_settings_with_their_defaults(monkeypatch):
    for name in ("APPLIANCE_LLM_GPU", "APPLIANCE_CONTROLLER_STALE_S", "APPLIANCE_WORKER_TIMEOUT",
                 "APPLIANCE_RAY_PLACEMENT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    s = Settings.load()
    assert (s.llm_gpu, s.controller_stale_s, s.worker_timeout_s, s.ray_placement_timeout_s) == (None, 600, 120, 300)
    monkeypatch.setenv("APPLIANCE_LLM_GPU", " 1 ")
    monkeypatch.setenv("APPLIANCE_WORKER_TIMEOUT", "30")
    s = Settings.load()
    assert (s.llm_gpu, s.worker_timeout_s) == ("1", 30.0)
    monkeypatch.setenv("APPLIANCE_CONTROLLER_STALE_S", "ten minutes")
    with pytest.raises(ConfigError, match="APPLIANCE_CONTROLLER_STALE_S='ten minutes': expected a positive number"):
        Settings.load()


def test_no_module_but_config_reads_an_appliance_variable():
    """One place per concern: a variable read elsewhere escapes the defaults, the checks and this list."""
    readers = set()
    for path in (REPO / "appliance").rglob("*.py"):
        if re.search(r"environ(\.get\(|\[)\s*[\"']APPLIANCE_", path.read_text()):
            readers.add(path.relative_to(REPO).as_posix())
    # models.py still reads where model profiles live (APPLIANCE_MODEL_PROFILES, APPLIANCE_MODELS) itself.
    assert readers <= {"appliance/config.py", "appliance/models.py"}, readers
