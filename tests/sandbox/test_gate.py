"""Device turns (sandbox/gate.py) between real jailed processes: never two at once, and no process can keep a
turn past its own life or take two; residency: no more device memory held at once than the budget allows."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

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
    # Someone had to wait, for a turn or (stopped while another measured) before it could even ask: they contended.
    assert sum(run.turns["wait_s"] + run.paused_s for _, run in results) > 0.3, [r.turns for _, r in results]


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
    # The device is free again: an honest process gets its turns at once (a turn never given back would hold it
    # until the 30 s timeout; 2 s leaves room for a loaded 2-core host's scheduling).
    (tmp_path / "after").mkdir()
    run = Jail().run([sys.executable, "-c", TURNS, "1"], workdir=tmp_path / "after", gate=gate, timeout_s=30)
    assert run.returncode == 0 and run.turns["turns"] == 1 and run.turns["wait_s"] < 2.0, run.turns


def test_an_exclusive_process_holds_the_device_from_start_to_end(tmp_path):
    gate = DeviceGate()
    (tmp_path / "a").mkdir()
    run = Jail().run([sys.executable, "-c", "import time; time.sleep(0.3)"], workdir=tmp_path / "a", gate=gate,
                     exclusive=True, timeout_s=30)
    assert run.returncode == 0 and run.turns["turns"] == 1 and run.turns["held_s"] >= run.wall_s * 0.9
    assert gate.idle()  # released afterwards


# Residency (the memory budget). Inside the jail: run the steps given as arguments, logging when each one was done
# (atomically, so the test can read the log while the process runs). "wait:NAME" waits until the test creates NAME
# in the process's workdir: the test decides when a resident lets go.
HOLDER = """
import json, os, sys, time
from sandbox.harness.common import device_memory_freed, device_turn
log = []
for step in sys.argv[1:]:
    if step == "turn":
        with device_turn(shared=True):
            pass
    elif step == "free":
        device_memory_freed()
    elif step.startswith("wait:"):
        while not os.path.exists(step[5:]):
            time.sleep(0.01)
    elif step == "die":
        os.kill(os.getpid(), 9)
    log.append([step, time.time()])
    open("log.tmp", "w").write(json.dumps(log))
    os.replace("log.tmp", "log.json")
"""


class _Holder:
    """A jailed HOLDER process run on a thread, holding `nbytes` while resident."""

    def __init__(self, gate: DeviceGate, workdir: Path, steps: list[str], nbytes: int | None):
        workdir.mkdir()
        self.workdir, self.run = workdir, None
        self.thread = threading.Thread(target=self._run, args=(gate, steps, nbytes))
        self.thread.start()

    def _run(self, gate, steps, nbytes) -> None:
        self.run = Jail().run([sys.executable, "-c", HOLDER, *steps], workdir=self.workdir, gate=gate,
                              resident_bytes=nbytes, timeout_s=60)

    def log(self) -> list:
        path = self.workdir / "log.json"
        return json.loads(path.read_text()) if path.exists() else []

    def times(self, step: str) -> list[float]:
        return [t for s, t in self.log() if s == step]

    def go(self) -> None:
        (self.workdir / "go").touch()

    def done(self):
        self.thread.join(timeout=60)
        return self.run


def _until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_memory_budget_bounds_how_many_processes_are_resident(tmp_path):
    gate = DeviceGate(memory_bytes=2)  # room for two of the three
    holders = [_Holder(gate, tmp_path / f"p{i}", ["turn", "wait:go"], 1) for i in range(3)]
    _until(lambda: gate.residents() == 2 and gate.waiting() == 1 and sum(bool(h.times("turn")) for h in holders) == 2)
    time.sleep(0.3)
    assert gate.residents() == 2 and gate.waiting() == 1  # the third really waits
    first = next(h for h in holders if h.times("turn"))
    first.go()
    _until(lambda: all(h.times("turn") for h in holders))
    for h in holders:
        h.go()
    runs = [h.done() for h in holders]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    # From the processes' own clocks: never three resident at once (admitted at "turn", still there at "wait:go").
    spans = [(h.times("turn")[0], h.times("wait:go")[0]) for h in holders]
    for t, _ in spans:
        assert sum(start <= t <= end for start, end in spans) <= 2, spans
    third = max(holders, key=lambda h: h.times("turn")[0])
    assert third.times("turn")[0] >= first.times("wait:go")[0]
    assert third.run.turns["resident_wait_s"] >= 0.3, third.run.turns
    assert sorted(r.turns["neighbours"] for r in runs) == [1, 1, 1]
    assert gate.residents() == 0


def test_freed_memory_lets_the_next_one_in_and_a_later_turn_is_admitted_again(tmp_path):
    gate = DeviceGate(memory_bytes=1)
    early = _Holder(gate, tmp_path / "early", ["turn", "free", "wait:go", "turn"], 1)
    _until(lambda: early.times("free"))
    late = _Holder(gate, tmp_path / "late", ["turn", "wait:go"], 1)
    _until(lambda: late.times("turn"))  # admitted while `early` is alive: F ended its residency
    early.go()  # `early` asks for a turn again: it must be admitted again, and `late` is resident
    _until(lambda: gate.waiting() == 1)
    time.sleep(0.3)
    assert len(early.times("turn")) == 1
    late.go()
    early_run, late_run = early.done(), late.done()
    assert early_run.returncode == 0 and late_run.returncode == 0, early_run.stderr + late_run.stderr
    assert early.times("turn")[1] >= late.times("wait:go")[0]
    assert early_run.turns["turns"] == 2 and early_run.turns["resident_wait_s"] >= 0.3, early_run.turns
    assert early_run.turns["neighbours"] == 0 and late_run.turns["neighbours"] == 0  # never resident together


def test_a_process_killed_while_resident_frees_its_bytes(tmp_path):
    gate = DeviceGate(memory_bytes=1)
    killed = _Holder(gate, tmp_path / "killed", ["turn", "wait:go", "die"], 1)
    _until(lambda: killed.times("turn"))
    waiting = _Holder(gate, tmp_path / "waiting", ["turn"], 1)
    _until(lambda: gate.waiting() == 1)
    killed.go()
    assert killed.done().signal == 9
    run = waiting.done()
    assert run.returncode == 0 and run.turns["turns"] == 1 and run.turns["resident_wait_s"] > 0, run.turns
    assert gate.residents() == 0 and gate.waiting() == 0


def test_a_process_bigger_than_the_budget_runs_alone(tmp_path):
    gate = DeviceGate(memory_bytes=1)
    big = _Holder(gate, tmp_path / "big", ["turn", "wait:go"], 10)
    _until(lambda: big.times("turn"))  # admitted at once: nothing else was resident
    small = _Holder(gate, tmp_path / "small", ["turn"], 1)
    _until(lambda: gate.waiting() == 1)
    time.sleep(0.2)
    assert not small.times("turn")
    big.go()
    assert big.done().returncode == 0 and small.done().returncode == 0
    assert small.times("turn")[0] >= big.times("wait:go")[0]
    assert big.run.turns["neighbours"] == 0 and small.run.turns["neighbours"] == 0


@pytest.mark.parametrize("budget, big", [(2, 2), (None, None)], ids=["budget", "whole-device-without-budget"])
def test_admission_is_in_arrival_order(tmp_path, budget, big):
    """A big request waits for room; small ones that arrive after it wait behind it, though they would fit."""
    gate = DeviceGate(memory_bytes=budget)
    small1 = _Holder(gate, tmp_path / "small1", ["turn", "wait:go"], 1)
    _until(lambda: small1.times("turn"))
    large = _Holder(gate, tmp_path / "large", ["turn", "wait:go"], big)
    _until(lambda: gate.waiting() == 1)
    small2 = _Holder(gate, tmp_path / "small2", ["turn", "wait:go"], 1)
    _until(lambda: gate.waiting() == 2)
    time.sleep(0.2)
    assert not small2.times("turn")  # it would fit beside small1, but `large` came first
    small1.go()
    _until(lambda: large.times("turn"))
    time.sleep(0.2)
    assert not small2.times("turn")  # no room beside `large`
    large.go()
    small2.go()
    runs = [h.done() for h in (small1, large, small2)]
    assert all(r.returncode == 0 for r in runs)
    assert small1.times("turn")[0] < large.times("turn")[0] < small2.times("turn")[0]


def test_an_exclusive_process_is_resident_from_start_to_end(tmp_path):
    gate = DeviceGate(memory_bytes=1)
    holder = _Holder(gate, tmp_path / "holder", ["turn", "wait:go"], 1)
    _until(lambda: holder.times("turn"))
    threading.Timer(0.3, holder.go).start()
    (tmp_path / "x").mkdir()
    run = Jail().run([sys.executable, "-c", "pass"], workdir=tmp_path / "x", gate=gate, exclusive=True,
                     resident_bytes=1, timeout_s=30)
    assert run.returncode == 0 and run.turns["resident_wait_s"] > 0, run.turns  # (the jail's set-up ran meanwhile)
    assert holder.done().returncode == 0
    assert gate.residents() == 0 and gate.idle()


def test_a_lent_turn_is_taken_back_ahead_of_waiting_measurements_but_not_during_one():
    from sandbox.gate import TurnRecord

    gate = DeviceGate()
    def take_and_give_back(exclusive: bool) -> None:
        record = TurnRecord()
        gate.release(record, gate.acquire(record, exclusive=exclusive))

    holder = gate.acquire(TurnRecord(), exclusive=False)  # someone's shared turn: a measurement has to wait
    waiting = threading.Thread(target=take_and_give_back, args=(True,))
    waiting.start()
    _until(lambda: gate._exclusive_waiting == 1)
    taken = []
    taking = threading.Thread(target=lambda: taken.append(gate.acquire(TurnRecord(), exclusive=False, ahead=True)))
    taking.start()
    taking.join(timeout=10)
    assert taken, "a turn taken back after a compile waited behind a measurement that had not started"
    back = taken[0]
    plain = threading.Thread(target=take_and_give_back, args=(False,))
    plain.start()
    time.sleep(0.2)
    assert plain.is_alive()  # an ordinary shared turn queues behind the waiting measurement
    gate.release(TurnRecord(), back)
    gate.release(TurnRecord(), holder)
    waiting.join(timeout=10)
    plain.join(timeout=10)
    assert not waiting.is_alive() and not plain.is_alive() and gate.idle()


def test_waiting_for_admission_does_not_count_against_the_process_timeout(tmp_path):
    from sandbox.gate import TurnRecord

    gate = DeviceGate(memory_bytes=1)
    neighbour = TurnRecord()
    gate.admit(neighbour, 1)  # the budget is taken until the test lets go
    threading.Timer(7.0, gate.leave, args=(neighbour,)).start()
    (tmp_path / "job").mkdir()
    code = "from sandbox.harness.common import device_turn\nwith device_turn(shared=True):\n    pass\n"
    run = Jail().run([sys.executable, "-c", code], workdir=tmp_path / "job", gate=gate, resident_bytes=1,
                     timeout_s=5)
    assert not run.timed_out and run.returncode == 0, (run.stderr, run.turns)
    assert run.turns["resident_wait_s"] > 1, run.turns  # it waited, and the wait was not held against it


def test_occupancy_accounts_for_each_state_of_the_device():
    """A shared turn held while a measurement waits, then the measurement: the gate's seconds per state say so,
    and they add up to the time since the gate was made."""
    from sandbox.gate import TurnRecord

    t0 = time.monotonic()
    gate = DeviceGate()
    reader, writer = TurnRecord(), TurnRecord()
    shared = gate.acquire(reader, exclusive=False)

    def measure() -> None:
        held = gate.acquire(writer, exclusive=True)
        time.sleep(0.1)
        gate.release(writer, held)

    thread = threading.Thread(target=measure)
    thread.start()
    while not gate._exclusive_waiting:  # the measurement is now waiting for the shared turn
        time.sleep(0.001)
    time.sleep(0.2)
    gate.release(reader, shared)
    thread.join()
    states = gate.occupancy()
    assert states["shared, a measurement waiting"] >= 0.2 and states["measuring"] >= 0.1, states
    assert set(states) <= {"measuring", "shared", "shared, a measurement waiting", "idle, turns asked for", "idle"}
    assert sum(states.values()) == pytest.approx(time.monotonic() - t0, abs=0.05)


# Inside the jail: ticks (a time stamp each ~20 ms) into ticks.txt, and the same from a child that left the process
# group and the session (setsid) into child.txt: a process that hides from a process-group stop.
TICKER = """
import os, sys, time
name = "child.txt" if os.fork() == 0 else "ticks.txt"
if name == "child.txt":
    os.setsid()
for _ in range(int(sys.argv[1])):
    with open(name, "a") as f:
        f.write(f"{time.time()}\\n")
    time.sleep(0.02)
if name == "ticks.txt":
    os.wait()
"""


def _ticks(path: Path) -> list[float]:
    return [float(x) for x in path.read_text().split()] if path.exists() else []


# A tree that tries to outrun a stop: 512 MiB of private memory touched (each fork copies its page tables, so a fork
# is slow and likely under way when a stop comes), then forks back to back, each child sending SIGCONT to every
# process it may signal. Against a SIGSTOP per listed pid, the child of a fork in progress is listed too late and
# lets the whole tree go on; a cgroup freezer stops forks too.
FORKER = """
import mmap, os, signal, sys, time
ticker = os.fork()
if ticker == 0:
    for _ in range(int(sys.argv[1])):
        with open("ticks.txt", "a") as f:
            f.write(f"{time.time()}\\n")
        time.sleep(0.02)
    os._exit(0)
m = mmap.mmap(-1, 512 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, 512 << 20, 4096):
    m[off] = 1
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
open("child.txt", "w").write(f"{time.time()}\\n")
end = time.monotonic() + 4.0
while time.monotonic() < end:
    if os.fork() == 0:
        try:
            os.kill(-1, signal.SIGCONT)
        except OSError:
            pass
        os._exit(0)
try:
    os.waitpid(ticker, 0)  # (children reap themselves: this waits for them all, then finds none)
except ChildProcessError:
    pass
"""


@pytest.mark.parametrize("script", ["ticker", "forker"])
def test_another_evaluations_processes_are_stopped_while_one_measures_and_not_charged_for_it(tmp_path, script):
    """While a process of one evaluation holds an exclusive turn (a measurement), every other evaluation's jailed
    processes stand still, a child that left the process group and a tree forking to outrun the stop included
    (another candidate can launch nothing into the measurement, nor share its CPUs), and go on afterwards; the
    seconds stopped extend their deadline, even past the timeout itself."""
    from sandbox.gate import TurnRecord

    gate, workdir, done = DeviceGate(), tmp_path / "other", {}
    workdir.mkdir()
    # the ticker: ~1 s of its own work under a 2.5 s timeout; the forker: ~4 s of forks beside ~8 s of ticks (on a
    # loaded 2-core host, touching its 512 MiB once took longer than 3 s of ticks: they ended before the stop)
    code, ticks, timeout = (TICKER, "40", 2.5) if script == "ticker" else (FORKER, "400", 20.0)
    ticker = threading.Thread(target=lambda: done.update(run=Jail().run(
        [sys.executable, "-c", code, ticks], workdir=workdir, paused_by=gate, group="other", timeout_s=timeout)))
    ticker.start()
    deadline = time.monotonic() + 30
    while not (_ticks(workdir / "ticks.txt") and _ticks(workdir / "child.txt")) and time.monotonic() < deadline:
        time.sleep(0.02)
    measuring = TurnRecord(group="measuring")
    held = gate.acquire(measuring)
    stopped_at = time.time()
    time.sleep(4.0)
    went_on_at = time.time()
    gate.release(measuring, held)
    ticker.join()
    run = done["run"]
    # the ticker: ~1 s of its own work and 4 s stopped, past twice its 2.5 s, but the stop was not its doing
    assert run.returncode == 0 and not run.timed_out, (run.returncode, run.stderr)
    assert run.paused_s >= 3.9, run.paused_s
    ticks = _ticks(workdir / "ticks.txt")
    assert ticks and ticks[-1] > went_on_at, f"it never went on: {ticks[-3:]}"
    during = [t for t in ticks if stopped_at + 0.1 < t < went_on_at]
    assert not during, f"it ticked {len(during)} times during the measurement"
    if script == "ticker":
        child = _ticks(workdir / "child.txt")
        assert not [t for t in child if stopped_at + 0.1 < t < went_on_at], "the setsid child ran on"
    # its own group's measurements do not stop it
    again = Jail().run([sys.executable, "-c", "import time; time.sleep(0.5)"], workdir=tmp_path / "own",
                       gate=gate, exclusive=True, group="own")
    assert again.returncode == 0 and again.paused_s == 0.0, again


def test_one_long_measurement_stops_the_others_for_at_most_max_quiet_s(monkeypatch):
    """A turn that outlasts MAX_QUIET_S (a whole prepare, a candidate hung in a timed call) lets the others go on
    and says so in its record; the next turn of the same process stops them again, for its own span only."""
    from sandbox import gate as gate_module
    from sandbox.gate import TurnRecord

    monkeypatch.setattr(gate_module, "MAX_QUIET_S", 0.3)
    gate, other = DeviceGate(), _Recorder()
    gate.pause_during_measurements(other, "b")
    record = TurnRecord(group="a")
    held = gate.acquire(record)
    assert gate.stopped("b") and not gate.stopped("a")
    time.sleep(0.8)
    assert other.calls == ["pause", "resume"] and record.quiet_cut == 1 and not gate.stopped("b")
    gate.release(record, held)
    held = gate.acquire(record)  # the same process's next turn: its own quiet, not cut by the first one's timer
    gate.release(record, held)
    time.sleep(0.5)
    assert other.calls == ["pause", "resume"] * 2 and record.quiet_cut == 1, (other.calls, record.quiet_cut)


# The referee's wait for an answer (sandbox/harness/referee.py Link), in a process the test stops for 4 s: its
# timeout counts only the time it ran.
WAITER = """
import os, socket, sys, time
from sandbox.harness.referee import Link
a, b = socket.socketpair()
a.settimeout(2.0)
if os.fork() == 0:
    time.sleep(5.5)
    b.sendall(b"x")
    os._exit(0)
print("waiting", flush=True)
t0 = time.monotonic()
try:
    Link(a)._wait_for_answer()
    print("answered", round(time.monotonic() - t0, 1))
except TimeoutError:
    print("timed out", round(time.monotonic() - t0, 1))
"""


@pytest.mark.parametrize("stopped", [True, False])
def test_the_referee_counts_only_its_running_time_waiting_for_an_answer(stopped):
    import os
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", WAITER], stdout=subprocess.PIPE, text=True,
                            cwd=str(Path(__file__).resolve().parents[2]))
    assert proc.stdout.readline().strip() == "waiting"
    if stopped:  # as the gate stops it while another evaluation measures
        time.sleep(0.1)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(4.0)
        os.kill(proc.pid, signal.SIGCONT)
    said = proc.stdout.read().strip()
    proc.wait(timeout=30)
    # Stopped: ~1.5 s of its own waiting, under the 2 s timeout. Running throughout: 5.5 s is past it.
    assert said.startswith("answered" if stopped else "timed out"), said


class _Recorder:
    """Stands where a jailed process tree would (the gate only calls pause() and resume())."""

    def __init__(self):
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


@pytest.mark.parametrize("pause_others", [True, False])
def test_an_exclusive_turn_stops_other_groups_only_and_shared_turns_stop_nobody(pause_others):
    from sandbox.gate import TurnRecord

    gate = DeviceGate(pause_others=pause_others)
    mine, other, late = _Recorder(), _Recorder(), _Recorder()
    gate.pause_during_measurements(mine, "a")
    leave_other = gate.pause_during_measurements(other, "b")
    shared = gate.acquire(TurnRecord(group="b"), exclusive=False)
    gate.release(TurnRecord(group="b"), shared)
    assert mine.calls == other.calls == []  # shared turns (correctness) leave everyone running
    held = gate.acquire(TurnRecord(group="a"))
    gate.pause_during_measurements(late, "c")  # started during the measurement: stopped at once
    leave_other()  # one that ends during the measurement goes on (is let go) as it leaves
    gate.release(TurnRecord(group="a"), held)
    assert mine.calls == []
    assert other.calls == (["pause", "resume"] if pause_others else [])
    assert late.calls == (["pause", "resume"] if pause_others else [])


class _Failing(_Recorder):
    """A process tree whose stop and resume fail (gone meanwhile, a pid that is someone else's)."""

    def pause(self) -> None:
        super().pause()
        raise PermissionError("not ours")

    def resume(self) -> None:
        super().resume()
        raise ProcessLookupError("gone")


def test_a_stop_or_resume_that_fails_leaves_the_gate_working():
    """The reviewer's finding: a stop that raised inside acquire left the exclusive turn set with no one to release
    it, and every later turn waited for ever."""
    from sandbox.gate import TurnRecord

    gate, failing, other = DeviceGate(), _Failing(), _Recorder()
    gate.pause_during_measurements(failing, "b")
    gate.pause_during_measurements(other, "c")
    record = TurnRecord(group="a")
    held = gate.acquire(record)
    gate.release(record, held)
    assert failing.calls == other.calls == ["pause", "resume"]
    done = threading.Event()
    threading.Thread(target=lambda: (gate.release(record, gate.acquire(record)), done.set()), daemon=True).start()
    assert done.wait(5), "the next exclusive turn never came"


def test_an_evaluation_called_off_before_it_measured_gets_no_turn_and_one_that_measured_is_not_called_off():
    """DeviceGate.abandon_unmeasured: waits for a turn or for admission end in TurnAbandoned at once; a group that
    had an exclusive turn is never abandoned (its measurement is finished and recorded)."""
    from sandbox.gate import TurnAbandoned, TurnRecord

    gate = DeviceGate(memory_bytes=100, pause_others=False)
    measuring = TurnRecord(group="measuring")
    gate.admit(measuring, 60)
    held = gate.acquire(measuring, exclusive=True)
    waits: dict[str, BaseException | None] = {}

    def wait(name: str, exclusive: bool, nbytes: int) -> None:
        record = TurnRecord(group=name)
        try:
            gate.admit(record, nbytes)
            gate.release(record, gate.acquire(record, exclusive=exclusive))
            waits[name] = None
        except TurnAbandoned as e:
            waits[name] = e
        finally:
            gate.leave(record)  # (as a turn channel does when its process ends)

    threads = [threading.Thread(target=wait, args=args) for args in
               (("for_a_turn", True, 30), ("for_a_shared_turn", False, 0), ("for_admission", True, 50))]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert not waits  # all three wait: a turn is held, and 60 + 30 + 50 bytes do not fit the budget
    assert gate.abandon_unmeasured({"measuring"}) is False  # it measures: finished, not called off
    for t, name in zip(threads, ("for_a_turn", "for_a_shared_turn", "for_admission")):
        assert gate.abandon_unmeasured({name}) is True
        t.join(timeout=5)
        assert not t.is_alive() and isinstance(waits[name], TurnAbandoned), name
    assert gate.waiting() == 0 and gate.residents() == 1  # the measuring one
    gate.release(measuring, held)
    late = TurnRecord(group="for_a_turn")
    with pytest.raises(TurnAbandoned):  # called off for good: no turn later either
        gate.acquire(late, exclusive=True)
    gate.forget({"for_a_turn", "measuring"})  # its evaluation is over: a new one may use the name again
    gate.release(late, gate.acquire(late, exclusive=True))
    assert gate.abandon_unmeasured({"measuring"}) is True
