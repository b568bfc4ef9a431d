"""Per-job cgroups: a memory limit (RLIMIT_AS breaks CUDA), a process limit where the pids controller is delegated,
and a reliable kill of everything the job started. cgroup v1 (memory, and pids if mounted) or v2 (unified).

Each job's cgroup is a child of the cgroup the worker itself runs in (under systemd: the unit's delegated
cgroup), so no host-wide setup is needed beyond write access there.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


class CgroupUnavailable(RuntimeError):
    pass


@dataclass
class JobCgroup:
    dirs: dict[str, Path]  # controller ("memory", "pids") -> cgroup dir; both the same dir on v2
    version: int

    @classmethod
    def create(cls, memory_bytes: int, pids_max: int) -> JobCgroup:
        """A job cgroup with a memory limit, and a process limit where the pids controller is delegated (callers
        fall back to RLIMIT_NPROC without it: `"pids" in dirs` says which). Raises CgroupUnavailable when no memory
        limit can be had."""
        name = f"appliance-{uuid.uuid4().hex[:12]}"
        version, parents = _parents()
        dirs = {}
        try:
            for ctrl, parent in parents.items():
                d = parent / name
                try:
                    d.mkdir(exist_ok=True)
                except OSError:
                    if ctrl == "freezer":  # optional: without it a measurement stops the process group instead
                        continue
                    raise
                dirs[ctrl] = d
            mem = dirs["memory"]
            if version == 1:
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                _try_write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))  # no swapping around the limit
            else:
                (mem / "memory.max").write_text(str(memory_bytes))
                _try_write(mem / "memory.swap.max", "0")
            if "pids" in dirs:
                (dirs["pids"] / "pids.max").write_text(str(pids_max))
        except OSError as e:
            cls(dirs, version).remove()
            raise CgroupUnavailable(f"cannot create a job cgroup: {e}") from None
        return cls(dirs, version)

    def join(self) -> None:
        """Move the calling process in (called in the child between fork and exec)."""
        for d in set(self.dirs.values()):
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def kill_all(self) -> None:
        """SIGKILL every process in the job, including ones that left the session or the process group."""
        if self.version == 2 and (self.dirs["memory"] / "cgroup.kill").exists():
            _try_write(self.dirs["memory"] / "cgroup.kill", "1")
        for attempt in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if attempt == 0 and "freezer" in self.dirs:  # v1: a frozen task dies of SIGKILL only once thawed
                _try_write(self.dirs["freezer"] / "freezer.state", "THAWED")
            time.sleep(0.02)

    def freeze(self, frozen: bool) -> bool:
        """Stop (or let go on) every process in the job, including ones that left the session or the process group
        and ones forking meanwhile: cgroup v2's cgroup.freeze, or v1's freezer controller (polled until FROZEN).
        False where neither is there (the jail then stops the process group, which `setsid` escapes: such a host's
        measurements are not quiet of every process)."""
        if self.version == 2 and (self.dirs["memory"] / "cgroup.freeze").exists():
            _try_write(self.dirs["memory"] / "cgroup.freeze", "1" if frozen else "0")
            return True
        if "freezer" in self.dirs:
            state = self.dirs["freezer"] / "freezer.state"
            _try_write(state, "FROZEN" if frozen else "THAWED")
            for _ in range(250):  # FREEZING while a task is in the middle of something; a second at most
                try:
                    if not frozen or state.read_text().strip() == "FROZEN":
                        break
                except OSError:
                    break
                time.sleep(0.004)
            return True
        return False

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.dirs.get("pids", self.dirs["memory"]) / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def events(self) -> dict[str, int]:
        """How often the limits bit: oom_kill (memory) and pids_max (fork refused)."""
        out = {"oom_kill": 0, "pids_max": 0}
        mem = self.dirs["memory"] / ("memory.oom_control" if self.version == 1 else "memory.events")
        out["oom_kill"] = _field(mem, "oom_kill")
        if "pids" in self.dirs:
            out["pids_max"] = _field(self.dirs["pids"] / "pids.events", "max")
        return out

    def cpu_seconds(self) -> float | None:
        """CPU time of everything the job ran (v2's cpu.stat is there without the cpu controller; v1 needs cpuacct):
        the evidence that a SIGKILL came from the CPU-time limit, which bubblewrap's exit hides."""
        try:
            if self.version == 2:
                return _field(self.dirs["memory"] / "cpu.stat", "usage_usec") / 1e6
            if "cpuacct" in self.dirs:
                return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            pass
        return None

    def remove(self) -> None:
        for d in set(self.dirs.values()):
            for _ in range(250):  # 5 s: a SIGKILLed process with much memory takes a while to be gone
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # still busy for a moment after the last process died
                    time.sleep(0.02)


def _parents() -> tuple[int, dict[str, Path]]:
    """The worker's own cgroup per controller: memory always, pids where the host delegates it. cgroup v1 where its
    memory hierarchy is mounted, else v2."""
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            own[c] = path.lstrip("/")
    if (ROOT / "memory").is_dir() and "memory" in own:
        return 1, {c: ROOT / c / own[c] for c in ("memory", "pids", "cpuacct", "freezer")
                   if c in own and (ROOT / c).is_dir()}
    unified = ROOT / "unified" if (ROOT / "unified").is_dir() else ROOT
    base = unified / own.get("", "")
    controllers = (base / "cgroup.controllers").read_text().split() if (base / "cgroup.controllers").exists() else []
    if "memory" in controllers:
        wanted = {"memory", "pids"} & set(controllers)
        base = v2_job_parent(base, is_root=base == unified, wanted=wanted)
        return 2, {c: base for c in sorted(wanted)}
    raise CgroupUnavailable(f"no writable memory cgroup controller (v1 under {ROOT}, or v2 with memory delegated; "
                            f"{base} offers {' '.join(controllers) or 'none'}); under systemd give the worker unit "
                            "Delegate=yes")


WORKER_LEAF = "appliance-worker"


def v2_job_parent(own: Path, is_root: bool = False, wanted: set[str] = frozenset({"memory", "pids"})) -> Path:
    """Where job cgroups go on cgroup v2: beside the worker, never inside a cgroup that holds processes (a non-root
    cgroup with processes cannot enable controllers for its children). Under systemd with Delegate=yes, or in a
    container whose cgroup holds the worker itself, the worker moves that cgroup's processes into a leaf of their
    own, once, then enables the `wanted` controllers for the siblings it creates (what systemd >= 254 calls
    DelegateSubgroup=)."""
    base = own.parent if own.name == WORKER_LEAF else own
    try:
        if set(wanted) <= set((base / "cgroup.subtree_control").read_text().split()):
            return base
        if not is_root:
            leaf = base / WORKER_LEAF
            leaf.mkdir(exist_ok=True)
            for pid in (base / "cgroup.procs").read_text().split():
                _try_write(leaf / "cgroup.procs", pid)  # one pid per write; a process that exited meanwhile is gone
        (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
    except OSError as e:
        raise CgroupUnavailable(f"cannot delegate {' and '.join(sorted(wanted))} below {base}: {e} (give the "
                                "worker's systemd unit Delegate=yes)") from None
    return base


def probe() -> str:
    """A human-readable description of what cgroups provide here; raises CgroupUnavailable."""
    cg = JobCgroup.create(1 << 30, 64)
    try:
        pids = "pids limit" if "pids" in cg.dirs else "no pids controller (processes: RLIMIT_NPROC per jail uid)"
        return f"cgroup v{cg.version}: memory limit and {pids} under {cg.dirs['memory'].parent}"
    finally:
        cg.remove()


def _field(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _try_write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass
