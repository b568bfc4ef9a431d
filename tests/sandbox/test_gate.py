"""Device turns (sandbox/gate.py) between real jailed processes: never two at once, and no process can keep a
turn past its own life or take two."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from sandbox.gate import DeviceGate
from sandbox.jail import Jail

# Inside the jail: take `turns` turns, each ~0.3 s, and log when each began and ended (host clock: same machine).
TURNS = """
import json, sys, time
from sandbox.harness.common import device_turn
log = []
for _ in range(int(sys.argv[1])):
    time.sleep(0.05)  # work outside the turn
    with device_turn():
        start = time.time(); time.sleep(0.3); log.append([start, time.time()])
open("turns.json", "w").write(json.dumps(log))
"""


def _run_all(jail: Jail, gate: DeviceGate, scripts: list[tuple[str, list[str]]], tmp_path: Path) -> list:
    results = [None] * len(scripts)

    def one(i: int) -> None:
        workdir = tmp_path / f"job{i}"
        workdir.mkdir()
        code, args = scripts[i]
        results[i] = (workdir, jail.run([sys.executable, "-c", code, *args], workdir=workdir, gate=gate,
                                        timeout_s=60))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(scripts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_turns_of_jailed_processes_never_overlap(tmp_path):
    gate = DeviceGate()
    results = _run_all(Jail(), gate, [(TURNS, ["2"])] * 3, tmp_path)
    intervals = []
    for workdir, run in results:
        assert run.returncode == 0, run.stderr
        assert run.turns["turns"] == 2 and run.turns["held_s"] >= 0.6, run.turns
        intervals += json.loads((workdir / "turns.json").read_text())
    intervals.sort()
    assert len(intervals) == 6
    for (_, end), (start, _) in zip(intervals, intervals[1:]):
        assert start >= end, f"two turns overlapped: {intervals}"
    assert sum(run.turns["wait_s"] for _, run in results) > 0.3  # someone had to wait: they really contended


def test_a_process_that_dies_holding_a_turn_or_sends_garbage_cannot_block_the_device(tmp_path):
    dies_holding = """
import os
from sandbox.harness.common import _TURN_FDS
os.write(_TURN_FDS[0], b"A"); os.read(_TURN_FDS[1], 1)
os.write(_TURN_FDS[0], b"AAAA xyz")  # asks again while holding: ignored
os._exit(3)  # never releases
"""
    garbage = """
import os
from sandbox.harness.common import _TURN_FDS
os.write(_TURN_FDS[0], b"RRRR\\x00\\xff")  # releases it never had: ignored
"""
    gate = DeviceGate()
    results = _run_all(Jail(), gate, [(dies_holding, []), (garbage, [])], tmp_path)
    assert results[0][1].returncode == 3 and results[0][1].turns["turns"] == 1
    assert results[1][1].returncode == 0 and results[1][1].turns["turns"] == 0
    # The device is free again: an honest process gets its turns at once.
    (tmp_path / "after").mkdir()
    run = Jail().run([sys.executable, "-c", TURNS, "1"], workdir=tmp_path / "after", gate=gate, timeout_s=30)
    assert run.returncode == 0 and run.turns["turns"] == 1 and run.turns["wait_s"] < 0.2, run.turns


def test_an_exclusive_process_holds_the_device_from_start_to_end(tmp_path):
    gate = DeviceGate()
    (tmp_path / "a").mkdir()
    run = Jail().run([sys.executable, "-c", "import time; time.sleep(0.3)"], workdir=tmp_path / "a", gate=gate,
                     exclusive=True, timeout_s=30)
    assert run.returncode == 0 and run.turns["turns"] == 1 and run.turns["held_s"] >= run.wall_s * 0.9
    assert gate.idle()  # released afterwards
