"""One evaluation device, many evaluations in flight: they take turns on it, and only so many hold its memory.

Starting processes, importing, reading and writing files take most of an evaluation's time and need no GPU; they
overlap freely. GPU work comes in two kinds, and a `DeviceGate` (a readers-writer lock) keeps them apart:

  - measuring (timing, baselines, ceilings, Nsight Compute): an exclusive turn, with no other work of ours on the
    device, because other contexts' kernels and copies time-slice with the measured ones and skew both the timings
    and the energy;
  - light use (the first call that compiles, the correctness calls and their float64 check): a shared turn, any
    number at once, never during an exclusive one. Correctness is the same whatever else runs beside it. A waiting
    exclusive turn waits for every shared one in progress to end, so the exclusive turns and the shared ones they
    wait out bound a device's evaluations per hour: the referee keeps shared turns to one call each.

Device memory is held from a process's first upload to its last download, across turns: a full-size evaluation
holds several GiB for most of its GPU life. So a process is *resident* from its first turn request until it says its
device memory is freed (b"F") or exits, and the gate admits residents while their bytes (an estimate by the trusted
side, given when the channel is opened) fit `memory_bytes`: evaluations in flight are bounded by their CPU work,
while those holding GPU memory are bounded by the budget.

    harness process (jailed)                     trusted side (a thread per process, in the controller)
      writes b"S" (shared) or b"A" (exclusive) ->  not resident: waits to be admitted (arrival order), then
                                                   waits for that kind of turn (energy counter read for A)
      blocks reading its grant pipe          <-    writes b"G"
      ... GPU work ...
      writes b"R"                            ->    releases the turn (still resident)
      (a shared turn lent while Triton compiles: b"R", then b"C" takes it back ahead of waiting exclusive turns)
      ... more turns; then frees its memory
      writes b"F"                            ->    residency ends; a later request is admitted again

A process that exits (or is killed) releases its turn and its residency: the request pipe's end-of-file does.
Nothing a jailed process writes can take two turns or keep one past its own life; the wall-clock timeout still
applies. (A candidate that writes F early and keeps its memory can only cause out-of-memory errors, which the
pipeline retries alone.) Admission is in arrival order, so a big evaluation is not starved by small ones; one that
is bigger than the whole budget (or asks for the whole device) is admitted when nothing else is resident. A resident waiting for a turn never
waits for admission: turns and residency cannot deadlock.
Turns are recorded per process (seconds waited, seconds held exclusively, joules while held exclusively; seconds
waited for admission, most other residents seen): GPU-seconds and energy are charged for exclusive time only, so
evaluations that overlap are not charged twice. Waiting exclusive turns go first: light use never starves measuring.

A measurement is also taken with the host quiet of our other work: while a process holds an exclusive turn, every
other evaluation's jailed processes (registered by the jail, `pause_during_measurements`) are stopped (their job
cgroup frozen, else their process group stopped), and go on when the turn ends, or after MAX_QUIET_S of one turn
(a turn that long, a whole prepare or profile, or a hung candidate's, must not stop everyone else's work: the rest
of it is not quiet, and its record says so). Other evaluations' compiles, imports and checks would otherwise share
the CPUs with the measured round trips, and the baselines (measured with the device to themselves) would be timed
under other conditions than the candidates. A stopped candidate launches no new GPU work into the measurement;
kernels it queued before it was stopped still run (the GPU time-slices them with the measured ones). The
processes of the measuring evaluation (its referee and kernel server share a group) run on. Seconds stopped are the
others' doing: the jail adds them to the process's deadline, and the referee counts only its running time.

The harness side is `sandbox.harness.common.device_turn()` and `device_memory_freed()`, used by the referee alone (a
candidate's kernel server holds no turn pipes: the referee decides when it runs); processes that measure from
start to end (baselines, ceilings, Nsight Compute) are run with `exclusive=True`: resident and holding an exclusive
turn throughout.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

ENV_FDS = "APPLIANCE_TURN_FDS"  # "REQUEST_FD,GRANT_FD" inside the jail
MAX_QUIET_S = 120.0  # one exclusive turn stops the other evaluations' processes for at most this long


class TurnAbandoned(Exception):
    """The process's evaluation was called off before it measured (DeviceGate.abandon_unmeasured): no turn."""


@dataclass(eq=False)
class TurnRecord:
    turns: int = 0
    wait_s: float = 0.0
    held_s: float = 0.0  # exclusive turns
    shared_s: float = 0.0  # shared turns (they overlap each other: not charged)
    joules: float | None = None  # None where no energy counter can be read (CPU, no NVML)
    resident_wait_s: float = 0.0  # waiting to be admitted (the memory budget)
    neighbours: int = 0  # the most other residents present at once while this process was resident
    admitting_since: float | None = None  # monotonic time it began to wait for admission, while it waits
    group: str | None = None  # the evaluation it belongs to: its exclusive turns stop every other group's processes
    quiet_cut: int = 0  # its exclusive turns that outlasted MAX_QUIET_S (the others went on before it ended)

    def admission_s(self) -> float:
        """Seconds waited for admission so far, the wait in progress included."""
        since = self.admitting_since
        return self.resident_wait_s + (time.monotonic() - since if since is not None else 0.0)

    def as_dict(self) -> dict:
        return {"turns": self.turns, "wait_s": round(self.wait_s, 3), "held_s": round(self.held_s, 3),
                "shared_s": round(self.shared_s, 3),
                "joules": None if self.joules is None else round(self.joules, 3),
                "resident_wait_s": round(self.resident_wait_s, 3), "neighbours": self.neighbours,
                "quiet_cut": self.quiet_cut}


@dataclass
class DeviceGate:
    """The turns of one evaluation device (a GPU, or the CPU of a CPU-only host), and who holds its memory."""

    energy_meter: object | None = None  # sandbox.harness.energy.EnergyMeter of the GPU, read around exclusive turns
    memory_bytes: int | None = None  # what residents may hold together; None: no bound
    pause_others: bool = True  # stop other groups' processes during an exclusive turn
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _exclusive: bool = field(default=False, repr=False)
    _shared: int = field(default=0, repr=False)
    _exclusive_waiting: int = field(default=0, repr=False)
    _residents: dict = field(default_factory=dict, repr=False)  # TurnRecord -> bytes (None: the whole device)
    _arrivals: deque = field(default_factory=deque, repr=False)  # records waiting for admission, in order
    _shared_waiting: int = field(default=0, repr=False)
    _state_s: dict = field(default_factory=dict, repr=False)  # seconds the device spent in each state (occupancy)
    _state_since: float = field(default_factory=time.monotonic, repr=False)
    _pausable: dict = field(default_factory=dict, repr=False)  # a jailed process tree (pause(), resume()) -> group
    _paused: list = field(default_factory=list, repr=False)  # those stopped for the exclusive turn in progress
    _measuring: object = field(default=None, repr=False)  # the group of the exclusive turn in progress
    _quiet: object = field(default=None, repr=False)  # (turn token, record, timer) of the turn keeping others stopped
    _measured: set = field(default_factory=set, repr=False)  # groups that were granted an exclusive turn
    _abandoned: set = field(default_factory=set, repr=False)  # groups called off before they measured: no turns

    def abandon_unmeasured(self, groups: set[str]) -> bool:
        """Call off an evaluation (its processes' `groups`) that has not measured yet: its waits for admission and
        turns end in TurnAbandoned, and it is granted none from now on. False, and nothing changes, when one of
        its groups has had an exclusive turn: a measurement begun is finished and recorded."""
        with self._cond:
            if groups & self._measured:
                return False
            self._abandoned |= groups
            self._cond.notify_all()
            return True

    def forget(self, groups: set[str]) -> None:
        """The evaluation of these groups is over: what was known of them goes (a worker's gate lives for days)."""
        with self._cond:
            self._measured -= groups
            self._abandoned -= groups

    def _millijoules(self) -> int | None:
        return self.energy_meter.millijoules() if self.energy_meter is not None else None

    def admit(self, record: TurnRecord, nbytes: int | None) -> None:
        """Wait until `nbytes` fit beside the residents (first come, first admitted); then `record` is resident.
        None asks for the whole device: admitted only when nothing else is resident, budget or not."""
        t0 = time.monotonic()
        record.admitting_since = t0
        with self._cond:
            self._arrivals.append(record)
            self._cond.wait_for(lambda: record.group in self._abandoned
                                or (self._arrivals[0] is record and self._fits(nbytes)))
            self._arrivals.remove(record)
            if record.group in self._abandoned:
                record.admitting_since = None
                self._cond.notify_all()  # the next in line
                raise TurnAbandoned(record.group)
            self._residents[record] = nbytes
            for r in self._residents:
                r.neighbours = max(r.neighbours, len(self._residents) - 1)
            self._cond.notify_all()  # the next in line may fit as well
        record.resident_wait_s += time.monotonic() - t0
        record.admitting_since = None

    def _fits(self, nbytes: int | None) -> bool:
        held = list(self._residents.values())
        if not held:
            return True  # even one bigger than the budget: it runs, alone
        if nbytes is None or None in held:
            return False
        return self.memory_bytes is None or sum(held) + nbytes <= self.memory_bytes

    def leave(self, record: TurnRecord) -> None:
        with self._cond:
            if record in self._residents:
                del self._residents[record]
                self._cond.notify_all()

    def pause_during_measurements(self, process, group: str) -> Callable[[], None]:
        """Register a jailed process tree (`process.pause()`, `process.resume()`): stopped during every exclusive
        turn of another group, from now on (at once if one is in progress). Returns what unregisters it (and lets it
        go on, if stopped)."""
        with self._cond:
            self._pausable[process] = group
            if self._quiet is not None and self._measuring != group:
                self._pause(process)

        def unregister() -> None:
            with self._cond:
                self._pausable.pop(process, None)
                if process in self._paused:
                    self._paused.remove(process)
                    _quietly(process.resume)
        return unregister

    def _pause(self, process) -> None:
        self._paused.append(process)  # (first: resumed at the end even if stopping it half failed)
        _quietly(process.pause)

    def _end_quiet(self, turn: object | None = None) -> None:
        """Let every stopped process go on (under the lock): the turn ended, or (`turn`, MAX_QUIET_S ran out) only
        if that very turn still keeps them stopped."""
        if self._quiet is None or (turn is not None and self._quiet[0] is not turn):
            return
        _, record, timer = self._quiet
        if turn is not None:
            record.quiet_cut += 1
        else:
            timer.cancel()
        for process in self._paused:
            _quietly(process.resume)
        self._paused.clear()
        self._quiet = None

    def _cut_quiet(self, turn: object) -> None:
        with self._cond:
            self._end_quiet(turn)

    def stopped(self, group: str) -> bool:
        """Whether `group`'s processes are stopped now (another group measures, quietly)."""
        with self._cond:
            return self._quiet is not None and self._measuring != group

    def residents(self) -> int:
        with self._cond:
            return len(self._residents)

    def waiting(self) -> int:
        """Processes waiting to be admitted."""
        with self._cond:
            return len(self._arrivals)

    def acquire(self, record: TurnRecord, exclusive: bool = True, ahead: bool = False) -> tuple[bool, float, int | None]:
        """`ahead`: a shared turn taken back after it was lent for a compile goes before waiting exclusive turns
        (it waits only for one that holds the device), so a first call is not held up once per kernel it compiles."""
        t0 = time.monotonic()
        with self._cond:
            if exclusive:
                self._account()
                self._exclusive_waiting += 1
                self._cond.wait_for(lambda: record.group in self._abandoned or
                                    (not self._exclusive and self._shared == 0))
                self._account()
                self._exclusive_waiting -= 1
                if record.group in self._abandoned:
                    self._cond.notify_all()  # shared turns that waited behind this one
                    raise TurnAbandoned(record.group)
                self._exclusive = True
                self._measuring = record.group
                self._measured.add(record.group)
                if self.pause_others:  # the host quiet of our other work while it measures
                    turn = object()
                    timer = threading.Timer(MAX_QUIET_S, self._cut_quiet, args=(turn,))
                    timer.daemon = True
                    self._quiet = (turn, record, timer)
                    for process, group in self._pausable.items():
                        if group != record.group:
                            self._pause(process)
                    timer.start()
            else:
                self._account()
                self._shared_waiting += 1
                self._cond.wait_for(lambda: record.group in self._abandoned or
                                    (not self._exclusive and (ahead or self._exclusive_waiting == 0)))
                self._account()
                self._shared_waiting -= 1
                if record.group in self._abandoned:
                    raise TurnAbandoned(record.group)
                self._shared += 1
        now = time.monotonic()
        record.turns += 1
        record.wait_s += now - t0
        return exclusive, now, self._millijoules() if exclusive else None

    def release(self, record: TurnRecord, since: tuple[bool, float, int | None]) -> None:
        exclusive, started, mj0 = since
        if exclusive:
            mj1 = self._millijoules()
            record.held_s += time.monotonic() - started
            if mj0 is not None and mj1 is not None:
                record.joules = (record.joules or 0.0) + (mj1 - mj0) / 1e3
        else:
            record.shared_s += time.monotonic() - started
        with self._cond:
            self._account()
            if exclusive:
                self._end_quiet()
                self._exclusive, self._measuring = False, None
            else:
                self._shared -= 1
            self._cond.notify_all()

    def _account(self) -> None:
        """Add the time since the last change to the state the device was in (called, under the lock, before
        every change of who holds or waits for a turn)."""
        now = time.monotonic()
        state = self._state()
        self._state_s[state] = self._state_s.get(state, 0.0) + now - self._state_since
        self._state_since = now

    def _state(self) -> str:
        if self._exclusive:
            return "measuring"
        if self._shared:
            return "shared, a measurement waiting" if self._exclusive_waiting else "shared"
        return "idle, turns asked for" if self._exclusive_waiting or self._shared_waiting else "idle"

    def occupancy(self) -> dict[str, float]:
        """Seconds since the gate was made, per state of the device: "measuring" (an exclusive turn), "shared"
        (shared turns only), "shared, a measurement waiting" (what a measurement waits out), "idle, turns asked for"
        (a moment between a release and the next grant), "idle". What bounds a device's evaluations per hour:
        with "idle" near zero, the turns themselves do."""
        with self._cond:
            self._account()
            return {k: round(v, 3) for k, v in self._state_s.items()}

    def idle(self) -> bool:
        with self._cond:
            return not self._exclusive and self._shared == 0

    def open_channel(self, resident_bytes: int | None = 0, group: str | None = None) -> TurnChannel:
        """The pipes of one process that will hold `resident_bytes` of device memory (None: the whole device), of
        evaluation `group`."""
        return TurnChannel(self, resident_bytes, group)


class TurnChannel:
    """The pipes between one harness process and the gate, and the thread that serves its requests."""

    def __init__(self, gate: DeviceGate, resident_bytes: int | None = 0, group: str | None = None):
        self.gate, self.record, self.resident_bytes = gate, TurnRecord(group=group), resident_bytes
        self._request_r, self.request_w = os.pipe()
        self.grant_r, self._grant_w = os.pipe()
        self._thread: threading.Thread | None = None

    @property
    def child_fds(self) -> tuple[int, int]:
        return self.request_w, self.grant_r

    def env(self) -> dict[str, str]:
        return {ENV_FDS: f"{self.request_w},{self.grant_r}"}

    def start(self) -> None:
        """After the child was started: drop our copies of its ends (so its exit is our end-of-file), serve it."""
        os.close(self.request_w)
        os.close(self.grant_r)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close_unstarted(self) -> None:
        if self._thread is not None:
            return  # started: the serving thread closes its ends, the child's were closed at start
        for fd in (self.request_w, self.grant_r, self._request_r, self._grant_w):
            _close(fd)

    def join(self) -> TurnRecord:
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.record

    def _serve(self) -> None:
        held, resident = None, False
        try:
            while chunk := os.read(self._request_r, 64):
                for byte in chunk:
                    if byte in (ord("A"), ord("S"), ord("C")) and held is None:
                        if not resident:  # admitted before the turn; a resident never waits here
                            self.gate.admit(self.record, self.resident_bytes)
                            resident = True
                        held = self.gate.acquire(self.record, exclusive=byte == ord("A"), ahead=byte == ord("C"))
                        try:
                            os.write(self._grant_w, b"G")
                        except OSError:  # the process died while it waited: give the turn straight back
                            self.gate.release(self.record, held)
                            held = None
                    elif byte == ord("R") and held is not None:
                        self.gate.release(self.record, held)
                        held = None
                    elif byte == ord("F") and resident:
                        self.gate.leave(self.record)
                        resident = False
                    # anything else (a second A, a stray R or F, garbage) changes nothing
        except (OSError, TurnAbandoned):  # (abandoned: its process is being killed; its pipes close below)
            pass
        finally:
            if held is not None:
                self.gate.release(self.record, held)
            if resident:
                self.gate.leave(self.record)
            _close(self._request_r)
            _close(self._grant_w)


def _quietly(step: Callable[[], None]) -> None:
    """Stopping or letting go on a process tree: a failure (it went away meanwhile) must never leave the gate's
    state half changed (an exclusive turn set and never released would stop the device for good)."""
    try:
        step()
    except Exception:  # noqa: BLE001 - see above
        pass


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
