"""Snapshots of the main screens (pytest-textual-snapshot) on the fixed database of tests/tui/demo.py.
After an intended change of a screen: `python -m pytest tests/tui/test_snapshots.py --snapshot-update`."""

from __future__ import annotations

import pytest

from appliance.db import Store
from appliance.tui import Actions, ApplianceApp
from tests.tui import demo
from tests.tui.conftest import settle

SIZE = (120, 36)


@pytest.fixture
def demo_app(tmp_path):
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    store = Store.open(url)
    demo.fill(store)
    yield lambda **kw: ApplianceApp(store, Actions(store, url, who="alice"), poll_s=60, **kw)
    store.close()


def keys(*pressed: str):
    """run_before for snap_compare: press keys one at a time, letting each screen load."""
    async def run(pilot) -> None:
        from textual.widgets import Input

        await settle(pilot)
        for key in pressed:
            await pilot.press(key)
            await settle(pilot)
        for field in pilot.app.screen.query(Input):  # a blinking cursor is drawn or not by the clock: CI flaked
            field.cursor_blink = False
        await pilot.pause()
    return run


def test_runs_screen(snap_compare, demo_app):
    assert snap_compare(demo_app(), terminal_size=SIZE, run_before=keys())


def test_run_screen(snap_compare, demo_app):
    assert snap_compare(demo_app(), terminal_size=SIZE, run_before=keys("down", "enter"))


def test_candidate_screen_source(snap_compare, demo_app):
    assert snap_compare(demo_app(run_id=1), terminal_size=SIZE, run_before=keys("w"))


def test_candidate_screen_diff(snap_compare, demo_app):
    assert snap_compare(demo_app(run_id=1), terminal_size=SIZE, run_before=keys("w", "2"))


def test_candidate_screen_evidence(snap_compare, demo_app):
    assert snap_compare(demo_app(run_id=1), terminal_size=SIZE, run_before=keys("w", "3"))


def test_candidate_screen_timings(snap_compare, demo_app):
    assert snap_compare(demo_app(run_id=1), terminal_size=SIZE, run_before=keys("w", "4"))


def test_approve_dialog(snap_compare, demo_app):
    assert snap_compare(demo_app(run_id=1), terminal_size=SIZE, run_before=keys("a"))


NARROW = (80, 24)  # an SSH session's default terminal


def test_runs_screen_at_80x24(snap_compare, demo_app):
    assert snap_compare(demo_app(), terminal_size=NARROW, run_before=keys())


def test_run_screen_at_80x24(snap_compare, demo_app):
    assert snap_compare(demo_app(), terminal_size=NARROW, run_before=keys("down", "enter"))


@pytest.mark.anyio
@pytest.mark.parametrize("pressed, last_key", [((), "Quit"), (("down", "enter"), "Budget"),
                                                (("down", "enter", "w"), "Reject")])
async def test_every_footer_key_fits_at_80x24(demo_app, pressed, last_key):
    """The footer's last key is on screen at 80 columns: none is cut off (the screens' keys, in order)."""
    import html
    import re

    app = demo_app()
    async with app.run_test(size=NARROW) as pilot:
        await keys(*pressed)(pilot)
        rows: dict[float, list[str]] = {}
        for m in re.finditer(r'<text[^>]*y="([\d.]+)"[^>]*>(.*?)</text>', app.export_screenshot()):
            rows.setdefault(float(m.group(1)), []).append(html.unescape(m.group(2)))
        footer = "".join(rows[max(rows)])
        assert last_key in footer, footer
