"""SVG screenshots of every TUI screen, from a real run: python scripts/tui_screenshots.py [--db URL --run N] [--out DIR]

Without --db it first makes a real run on the CPU in a temporary APPLIANCE_HOME (about a minute: the tuner on the
bundled softmax task, a hand submission that fails to compile, the winner approved by the current user)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from appliance.db import Store  # noqa: E402
from appliance.review import decide, winner  # noqa: E402
from appliance.tui import Actions, ApplianceApp  # noqa: E402


def make_run(home: Path) -> str:
    env = os.environ | {"APPLIANCE_HOME": str(home)}
    url = f"sqlite:///{home / 'appliance.db'}"
    fast = ["--device", "cpu", "--timing-budget", "0.05"]
    appliance = [sys.executable, "-m", "appliance", "--db", url]
    subprocess.run([*appliance, "optimize", str(REPO / "benchmarks/tasks/softmax.py"), "--max-candidates", "4",
                    *fast, "--json"], env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*appliance, "submit", "1", str(REPO / "tests/fixtures/candidates/compile_error.py")],
                   env=env, cwd=REPO, stdout=subprocess.DEVNULL)  # exits 1: the candidate is rejected
    store = Store.open(url)
    decide(store, winner(store, 1).candidate.id, "approve", "fastest of the run; diff and evidence reviewed")
    store.close()
    return url


async def shoot(url: str, run_id: int, out: Path) -> None:
    store = Store.open(url)
    failed = next((c.id for c, e in store.run_candidates(run_id) if e and e.verdict != "pass"), None)
    app = ApplianceApp(store, Actions(store, url), poll_s=0.5)
    async with app.run_test(size=(120, 36)) as pilot:

        async def press(*keys: str) -> None:
            for key in keys:
                await pilot.press(key)
                await pilot.pause(0.3)
                await app.workers.wait_for_complete()
                await pilot.pause()

        def save(name: str) -> None:
            app.save_screenshot(f"{name}.svg", str(out))
            print(out / f"{name}.svg")

        await press()
        save("runs")
        while app.screen.query_one("LiveTable").selected_key() != str(run_id):
            await press("down")
        await press("enter")
        save("run")
        await press("w")
        save("candidate-source")
        for key, name in (("2", "diff"), ("3", "evidence"), ("4", "timings")):
            await press(key)
            save(f"candidate-{name}")
        await press("a")
        save("approve-dialog")
        await press("escape", "escape")
        if failed is not None:
            rows = [r.candidate_id for r in app.screen.view.leaderboard]
            app.screen.query_one("LiveTable").move_cursor(row=rows.index(failed))
            await press("enter", "5")
            save("candidate-compiler-log")
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: make a real CPU run first)")
    parser.add_argument("--run", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "docs/screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or make_run(Path(tmp) / "home")
        asyncio.run(shoot(url, args.run, args.out))


if __name__ == "__main__":
    main()
