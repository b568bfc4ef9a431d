"""Host memory of one evaluation device's evaluations in flight: only as many start as fit.

An evaluation in flight holds host memory from its candidate's start to its job folder's removal: its output files
(gigabytes at full size, in memory where the job folders lie on a tmpfs such as /dev/shm, as they should on a GPU
host) and two harness processes' private memory (torch, CUDA's host-side state). Evaluations that start together
(a run's first wave) grow all at once; past the host's memory, the kernel's OOM killer picks a process, which may
be a candidate (seen on the H200 host: 3 SIGKILLed of a 16-evaluation first wave; the pipeline queues such a
candidate again, sandbox/jail.py host_oom_kills), the controller or the vLLM server beside it. So each evaluation
holds an estimate (`evaluation_bytes`, from trusted data only) against a budget before its processes start:

  - the budget: APPLIANCE_HOST_MEMORY_GIB of this host, or HOST_MEMORY_FRACTION of its MemTotal, read again while
    an evaluation waits (memory hot-plugged into a VM counts once it is there); on a GPU host, split evenly between
    its evaluation GPUs (each has a worker of its own; APPLIANCE_LLM_GPU serves the model), and shared by the GPUs
    of one process (`appliance optimize` without workers);
  - admission in arrival order; one bigger than the whole budget starts when nothing else holds any.

The device's own memory is budgeted apart, per process, by the gate (sandbox/gate.py). Not counted here: the
task's inputs, which prepare writes once per run (kept for reuse) or once per evaluation (`appliance eval`, before
its hold), and prepare's own process; nor a cgroup's memory limit, should the controller run under one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path

HOST_MEMORY_FRACTION = 0.75  # of MemTotal: the rest for the controller, the kept inputs, a model server, the kernel
# Private memory of one harness process at its busiest (RssAnon: torch, Triton, CUDA's host-side state; the referee
# reports its peak as stage_s rss_anon_peak_gib). On the H200 host (rmsnorm, full size) the referee peaked at
# 0.58 GiB and the baselines' referee at 0.66 GiB; 1.5 GiB leaves room for kernels' workspaces and Triton's compiler.
PROCESS_BYTES = {"cuda": 3 << 29, "cpu": 1 << 30}


def mem_total_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def evaluation_bytes(output_bytes: int, device: str, outputs_in_memory: bool) -> int:
    """What one evaluation holds at most: the candidate's and the check's private memory, and the output files
    where they take memory (on a tmpfs)."""
    return 2 * PROCESS_BYTES.get(device, PROCESS_BYTES["cuda"]) + (output_bytes if outputs_in_memory else 0)


class HostMemory:
    """A byte budget that evaluations hold while in flight (thread-safe; one per evaluation device, shared by every
    pipeline of that device, like its gate). `total_bytes`: the host's memory for evaluations (None: read MemTotal,
    take HOST_MEMORY_FRACTION); `share`: this device's part of it; `meminfo`: where MemTotal is read."""

    def __init__(self, total_bytes: int | None = None, share: float = 1.0, meminfo: Path = Path("/proc/meminfo")):
        self.total_bytes, self.share, self.meminfo = total_bytes, share, meminfo
        self._cond = threading.Condition()
        self._held: dict[object, int] = {}
        self._arrivals: deque = deque()

    def budget(self) -> int | None:
        """Bytes the evaluations of this device may hold together now; None: no bound (MemTotal unreadable)."""
        total = self.total_bytes
        if total is None:
            mem = mem_total_bytes(self.meminfo)
            total = None if mem is None else int(mem * HOST_MEMORY_FRACTION)
        return None if total is None else int(total * self.share)

    def held(self) -> int:
        with self._cond:
            return sum(self._held.values())

    @contextmanager
    def hold(self, nbytes: int):
        """Wait until `nbytes` fit beside what is held (first come, first admitted), hold them for the block.
        Yields the seconds waited."""
        token, t0 = object(), time.monotonic()
        with self._cond:
            self._arrivals.append(token)
            try:
                # A timed wait: a budget read from MemTotal may grow with nothing released.
                while not (self._arrivals[0] is token and self._fits(nbytes)):
                    self._cond.wait(timeout=1.0)
            finally:
                self._arrivals.remove(token)
                self._cond.notify_all()
            self._held[token] = nbytes
        try:
            yield time.monotonic() - t0
        finally:
            with self._cond:
                del self._held[token]
                self._cond.notify_all()

    def _fits(self, nbytes: int) -> bool:
        if not self._held:
            return True  # even one bigger than the budget: it runs, alone
        budget = self.budget()
        return budget is None or sum(self._held.values()) + nbytes <= budget
