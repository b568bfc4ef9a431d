"""One evaluation device, many evaluations in flight: only their measuring phases take turns.

Loading a candidate, compiling it, writing and reading its outputs and starting processes take most of an
evaluation's time but hardly touch the GPU; running it for correctness and timing must have the GPU alone. So
several evaluations run at once per device and a `DeviceGate` hands out the device in turns:

    harness process (jailed)                     trusted side (a thread per process, in the controller)
      ... load, compile: no turn needed ...
      writes b"A" to its request pipe      ->    waits for the device's lock, reads the energy counter,
      blocks reading its grant pipe        <-    writes b"G"
      ... correctness, timing ...
      writes b"R"                          ->    reads the energy counter, releases the lock

A process that exits (or is killed) while holding a turn releases it: the request pipe's end-of-file does. Nothing
a jailed process writes can take the lock twice or keep it past its own life; the wall-clock timeout still
applies, so a turn lasts at most as long as its process may. Turns are recorded per process (seconds waited,
seconds held, joules while held): GPU-seconds and energy are charged for held time only, so evaluations that
overlap are not charged twice.

The harness side is `sandbox.harness.common.device_turn()`; processes that need the device from start to end
(baseline timing, the ceilings, Nsight Compute) are run with `exclusive=True` and hold a turn throughout.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

ENV_FDS = "APPLIANCE_TURN_FDS"  # "REQUEST_FD,GRANT_FD" inside the jail


@dataclass
class TurnRecord:
    turns: int = 0
    wait_s: float = 0.0
    held_s: float = 0.0
    joules: float | None = None  # None where no energy counter can be read (CPU, no NVML)

    def as_dict(self) -> dict:
        return {"turns": self.turns, "wait_s": round(self.wait_s, 3), "held_s": round(self.held_s, 3),
                "joules": None if self.joules is None else round(self.joules, 3)}


@dataclass
class DeviceGate:
    """The turn lock of one evaluation device (a GPU, or the CPU of a CPU-only host)."""

    energy_meter: object | None = None  # sandbox.harness.energy.EnergyMeter of the GPU, read around each turn
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _millijoules(self) -> int | None:
        return self.energy_meter.millijoules() if self.energy_meter is not None else None

    def acquire(self, record: TurnRecord) -> tuple[float, int | None]:
        t0 = time.monotonic()
        self._lock.acquire()
        now = time.monotonic()
        record.turns += 1
        record.wait_s += now - t0
        return now, self._millijoules()

    def release(self, record: TurnRecord, since: tuple[float, int | None]) -> None:
        started, mj0 = since
        mj1 = self._millijoules()
        record.held_s += time.monotonic() - started
        if mj0 is not None and mj1 is not None:
            record.joules = (record.joules or 0.0) + (mj1 - mj0) / 1e3
        self._lock.release()

    def open_channel(self) -> TurnChannel:
        return TurnChannel(self)


class TurnChannel:
    """The pipes between one harness process and the gate, and the thread that serves its requests."""

    def __init__(self, gate: DeviceGate):
        self.gate, self.record = gate, TurnRecord()
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
        held = None
        try:
            while chunk := os.read(self._request_r, 64):
                for byte in chunk:
                    if byte == ord("A") and held is None:
                        held = self.gate.acquire(self.record)
                        try:
                            os.write(self._grant_w, b"G")
                        except OSError:  # the process died while it waited: give the turn straight back
                            self.gate.release(self.record, held)
                            held = None
                    elif byte == ord("R") and held is not None:
                        self.gate.release(self.record, held)
                        held = None
                    # anything else (a second A, a stray R, garbage) changes nothing
        except OSError:
            pass
        finally:
            if held is not None:
                self.gate.release(self.record, held)
            _close(self._request_r)
            _close(self._grant_w)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
