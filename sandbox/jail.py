"""Run one harness process in a bubblewrap jail; fail closed when the jail cannot be built.

The whole policy is one value (sandbox/policy.py, `Jail.policy()`): rendered into bubblewrap's arguments here and
printed by `appliance doctor`. Enforced: own network namespace (only `lo`) and a seccomp filter (sandbox/seccomp.py)
that also refuses IP and netlink sockets; own PID/IPC/UTS/cgroup namespaces; never host root: a worker running as
root gives each jail an unprivileged host uid of its own (`UidPool`), an unprivileged worker maps uid 65534 in a user
namespace to itself; no capabilities, no new privileges; a read-only minimal view of the system (system dirs, an
allowlist of /etc and /sys, /proc/sys read-only, the Python installation, the harness package) plus the job's own
folders, a private /tmp and private caches; only the assigned GPU's device nodes; a cleared environment; a memory
limit (sandbox/cgroup.py: no candidate runs without one, unless the operator opts out loudly) and a process limit
(the pids controller, else RLIMIT_NPROC); rlimits on CPU time (soft below hard, so the kill names the limit), file
size, open files and core dumps; the job's writable folders watched against a disk cap; captured output capped; a
wall-clock timeout that kills the whole tree.

`unsafe_no_jail=True` runs the same command as a plain subprocess (limits still apply), for development on
hosts without bubblewrap; callers must mark every result produced that way.
"""

from __future__ import annotations

import fcntl
import functools
import glob
import itertools
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import sandbox
from sandbox import policy as jail_policy
from sandbox.cgroup import CgroupUnavailable, JobCgroup
from sandbox.gate import DeviceGate, TurnChannel, TurnRecord
from sandbox.policy import Identity, Policy
from sandbox.seccomp import SeccompUnavailable, bpf_file
from sandbox.seccomp import policy as seccomp_policy

OUTPUT_TAIL = 64 << 10  # bytes of stdout/stderr kept per process; the rest is counted and dropped
CPU_GRACE_S = 5  # hard CPU limit = soft + this: SIGXCPU at the soft limit names the limit, SIGKILL follows
DISK_POLL_S = 0.1  # how often the job's writable folders are measured against the disk cap
DISK_MAX_ENTRIES = 100_000  # files and folders a job may create; past it, counting them is the attack
# Host uids for jails when the worker is root: far above regular and system users and the usual subordinate-uid
# ranges; one per jail at a time; their shared group reads the job's read-only folders.
JAIL_UID_BASE = 2_000_000_000
JAIL_UID_COUNT = 4096
JAIL_GROUP = JAIL_UID_BASE - 1
UID_SWITCH = (  # run inside the jail as root, before the harness: drop to the jail's uid, then exec it
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "uid, gid, groups = int(sys.argv[1]), int(sys.argv[2]), [int(g) for g in sys.argv[3].split(',') if g]\n"
    "for cap in range(64):  # the bounding set too: nothing is left to regain\n"
    "    if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:\n"
    "        sys.exit(f'jail: cannot drop capability {cap} from the bounding set')\n"
    "os.setgroups(groups); os.setresgid(gid, gid, gid); os.setresuid(uid, uid, uid)\n"
    "if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or 0 in os.getgroups():\n"
    "    sys.exit('jail: the switch to the jail uid did not hold')\n"
    "os.chdir(sys.argv[4])  # the job's folder is the jail uid's own: entered after the switch\n"
    "os.execv(sys.argv[5], sys.argv[5:])\n"
)


class JailUnavailable(RuntimeError):
    """The jail cannot be set up on this host; nothing was run."""


@dataclass
class JailResult:
    returncode: int | None
    timed_out: bool
    wall_s: float
    stdout: str
    stderr: str
    jailed: bool
    output_bytes: int = 0  # stdout + stderr produced, kept or not
    limit_events: dict = field(default_factory=dict)  # {"oom_kill": n, "pids_max": n, "disk_limit": bytes, ...}
    limits: dict = field(default_factory=dict)  # what was enforced, for the record
    turns: dict | None = None  # device turns taken (sandbox/gate.py): waited, held, joules while held
    cpu_s: float | None = None  # CPU seconds of the whole tree (its cgroup's count; unjailed: the reaped tree's)
    paused_s: float = 0.0  # seconds stopped while other evaluations measured (sandbox/gate.py)

    @property
    def signal(self) -> int | None:
        """The signal that ended the process: bwrap reports its child's death by signal N as exit 128+N."""
        rc = self.returncode
        if rc is None:
            return None
        if rc < 0:
            return -rc
        return rc - 128 if self.jailed and 128 < rc < 160 else None


class UidPool:
    """Unprivileged host uids for jails of a root worker, one per jail at a time across every process of the host
    (an flock per uid in a root-only folder; a killed holder's lock goes with it)."""

    def __init__(self, base: int = JAIL_UID_BASE, count: int = JAIL_UID_COUNT, lock_dir: Path | None = None):
        self.base, self.count = base, count
        self.lock_dir = lock_dir or _root_only_dir()

    def take(self) -> tuple[int, int]:
        """(uid, lock fd): close the fd to give the uid back."""
        first = random.randrange(self.count)
        for i in range(self.count):
            uid = self.base + (first + i) % self.count
            fd = os.open(self.lock_dir / str(uid), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return uid, fd
            except BlockingIOError:
                os.close(fd)
        raise JailUnavailable(f"all {self.count} jail uids from {self.base} are in use")


def _root_only_dir() -> Path:
    for parent in ("/run", tempfile.gettempdir()):
        path = Path(parent) / "appliance-jail-uids"
        try:
            path.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            continue
        st = path.lstat()
        if st.st_uid == 0 and not st.st_mode & 0o077 and path.is_dir() and not path.is_symlink():
            return path
    raise JailUnavailable("no root-only folder for the jail uids' locks under /run or the temp folder")


@dataclass
class Jail:
    unsafe_no_jail: bool = False
    gpu: int | None = None  # the evaluation GPU this worker owns; None on CPU hosts
    bwrap: str | None = field(default_factory=lambda: os.environ.get("APPLIANCE_BWRAP") or shutil.which("bwrap"))
    memory_bytes: int = 32 << 30
    pids_max: int = 1024
    max_file_bytes: int = 16 << 30
    open_files: int = 4096
    scratch_bytes: int = 4 << 30  # size of each private tmpfs (/tmp, /dev/shm, the job's tmp/ with its caches)
    disk_bytes: int = 16 << 30  # what the job's writable folders (workdir, rw) may hold in all; run() may say less
    cpu_seconds: int | None = None  # soft CPU-time limit per process; None: every core for the whole timeout
    # OPERATOR OPT-OUT, loudly named: run candidates where no memory limit can be enforced (a memory bomb can then
    # take the host into a global OOM). Every verdict says so (memory_limit_enforced(), stored with it).
    unsafe_no_memory_limit: bool = False
    uid_pool: UidPool | None = None  # jail uids of a root worker (made on first use)
    _checked: bool = field(default=False, init=False, repr=False)
    _memory_limit: bool | None = field(default=None, init=False, repr=False)

    @property
    def host_uid_mode(self) -> bool:
        """A worker running as root never lets the jail be root: each jail runs as a host uid of its own."""
        return os.geteuid() == 0 and not self.unsafe_no_jail

    def check(self) -> None:
        """Raise JailUnavailable with a fix hint unless bubblewrap, seccomp and a memory limit work here."""
        if self.unsafe_no_jail or self._checked:
            return
        if not self.bwrap or not os.access(self.bwrap, os.X_OK):
            raise JailUnavailable(
                f"bubblewrap (bwrap) not found{f' at {self.bwrap}' if self.bwrap else ''}: candidates cannot be "
                "jailed. Install it "
                "(Debian/Ubuntu: apt-get install bubblewrap) or set APPLIANCE_BWRAP to its path. "
                "For development only, --unsafe-no-jail runs candidates unjailed."
            )
        try:
            os.close(bpf_file())
        except SeccompUnavailable as e:
            raise JailUnavailable(str(e)) from None
        limits: dict = {}
        cgroup = self._cgroup(limits)  # raises unless a memory limit can be had (or the operator opted out)
        if cgroup:
            cgroup.remove()
        probe = self._probe()
        if probe.returncode != 0:
            raise JailUnavailable(
                f"bubblewrap at {self.bwrap} cannot create the jail: {probe.stderr.strip()[:500]}. It needs "
                "network, PID and (for a worker that is not root) user namespaces (check "
                "user.max_user_namespaces), or run the worker as root."
            )
        self._checked = True

    def memory_limit_enforced(self) -> bool:
        """Whether runs here are held to a memory limit: False only where none can be had and the operator opted
        out (or, unjailed, where the host has no cgroups)."""
        if self._memory_limit is None:
            try:
                JobCgroup.create(self.memory_bytes, self.pids_max).remove()
                self._memory_limit = True
            except CgroupUnavailable:
                self._memory_limit = False
        return self._memory_limit

    def _probe(self) -> JailResult:
        with tempfile.TemporaryDirectory(prefix="appliance-jail-probe-") as tmp:
            return self._run(["/bin/true"], Path(tmp), [], [], self._env(Path(tmp)), 30,
                             self._limits(30, self.disk_bytes), None, None, self.disk_bytes)

    def policy(self, identity: Identity | None = None, workdir: Path | None = None, ro=(), rw=()) -> Policy:
        """The jail as one value: what `run` renders into bubblewrap's arguments, and what `doctor` prints."""
        identity = identity or self._identity(JAIL_UID_BASE if self.host_uid_mode else None)
        mounts = jail_policy.system_mounts(_python_paths(), Path(sandbox.__file__).resolve().parent,
                                           self._gpu_nodes(), self.scratch_bytes, jail_policy.etc_files(identity))
        if workdir is not None:
            mounts += jail_policy.job_mounts(workdir, ro, rw, self.scratch_bytes)
        limits = self._limits(600.0, self.disk_bytes)  # what a run of the default timeout sets (_in_child)
        rlimits = {"core": (0, 0), "fsize": (limits["file_bytes"],) * 2, "nofile": (self.open_files,) * 2,
                   "cpu": (limits["cpu_seconds"], limits["cpu_hard_seconds"])}
        return Policy(
            identity=identity,
            namespaces=("pid", "net", "ipc", "uts", "cgroup", "mount") + (("user",) if identity.mode == "userns"
                                                                           else ()),
            mounts=tuple(jail_policy.with_parents(jail_policy.present(mounts))),
            rlimits=rlimits,
            cgroup={"memory_bytes": self._memory_cap(), "pids_max": self.pids_max,
                    "processes": "pids controller where delegated, else RLIMIT_NPROC",
                    "without a memory limit": "allowed (operator opt-out)" if self.unsafe_no_memory_limit
                    else "nothing runs"},
            disk_bytes=self.disk_bytes,
            seccomp=seccomp_policy(),
            environment=tuple(sorted(self._env(workdir or Path("/job")))),
            notes=("no capabilities, no new privileges; /proc fresh for the PID namespace, /proc/sys read-only to a "
                   "non-root uid", "the whole tree killed at the wall-clock limit"),
        )

    def run(self, argv: list[str], *, workdir: Path, ro: list[Path] = (), rw: list[Path] = (),
            env: dict[str, str] | None = None, timeout_s: float = 600.0, gate: DeviceGate | None = None,
            exclusive: bool = False, resident_bytes: int | None = 0, disk_bytes: int | None = None,
            extra_fds: tuple[int, ...] = (), stop: threading.Event | None = None, group: str | None = None,
            paused_by: DeviceGate | None = None) -> JailResult:
        """Run argv with `workdir` (writable, also HOME/TMPDIR/caches), `rw` writable and `ro` read-only paths.
        Together, workdir and rw may hold `disk_bytes` (default: the jail's disk_bytes; the caller, who knows what
        the job must write, may set its own).

        With a `gate`, the process takes turns on the device (sandbox/gate.py): it asks for them itself, or, with
        `exclusive`, holds one from start to end. It holds `resident_bytes` of device memory while resident (None:
        the whole device); with `exclusive`, from start to end too.

        With a `gate` (or `paused_by`, for a process that takes no turns itself, such as a kernel server), the
        process is stopped while another `group` (evaluation) holds an exclusive turn; processes of one evaluation
        share a group (default: one of its own).

        `extra_fds` (a socket to the process's peer) are passed in and closed here once the child has them, or when
        nothing could start. Setting `stop` kills the process early (its peer is done with it)."""
        workdir = Path(workdir)
        (workdir / "tmp").mkdir(parents=True, exist_ok=True)
        quiet = gate if gate is not None else paused_by
        group = group or f"{os.getpid()}-{next(_GROUPS)}"
        channel = gate.open_channel(resident_bytes, group) if gate is not None and not exclusive else None
        full_env = self._env(workdir) | (env or {}) | (channel.env() if channel else {})
        disk = disk_bytes or self.disk_bytes
        limits = self._limits(timeout_s, disk)
        record, held, cgroup = TurnRecord(group=group), None, None
        owned = list(extra_fds)  # _run empties it once the child has them
        try:
            if gate is not None and exclusive:
                gate.admit(record, resident_bytes)  # (in the try: a wait called off closes the fds all the same)
            if not self.unsafe_no_jail:
                self.check()
            cgroup = self._cgroup(limits)
            if gate is not None and exclusive:
                held = gate.acquire(record)
            result = self._run(argv, workdir, list(ro), list(rw), full_env, timeout_s, limits, cgroup, channel, disk,
                               owned, stop, (quiet, group) if quiet is not None else None)
        except BaseException:
            for fd in owned:
                os.close(fd)
            if channel:
                channel.close_unstarted()  # nothing was started (no jail, no fork): no pipe may leak
            if cgroup:
                cgroup.remove()
            raise
        finally:
            if held is not None:
                gate.release(record, held)
            if gate is not None and exclusive:
                gate.leave(record)
                gate.forget({group})
        if channel:
            record = channel.join()
        result.turns = record.as_dict() if gate is not None else None
        return result

    def _run(self, argv, workdir: Path, ro, rw, full_env: dict, timeout_s: float, limits: dict,
             cgroup: JobCgroup | None, channel: TurnChannel | None, disk: int, extra_fds: list[int] | None = None,
             stop: threading.Event | None = None, quiet: tuple[DeviceGate, str] | None = None) -> JailResult:
        extra_fds = extra_fds if extra_fds is not None else []
        pass_fds: tuple[int, ...] = channel.child_fds if channel else ()
        uid_lock, identity = None, None
        if self.unsafe_no_jail:
            cmd = argv
        else:
            if self.host_uid_mode:
                self.uid_pool = self.uid_pool or UidPool()
                uid, uid_lock = self.uid_pool.take()
                identity = self._identity(uid)
                _grant(identity, [workdir, *rw], ro)
            else:
                identity = self._identity(None)
            pol = self.policy(identity, workdir, ro, rw)
            seccomp_fd = bpf_file()
            data_fds = []
            args = []
            for m in pol.mounts:
                if m.kind == "data":
                    fd = os.memfd_create("jail-etc")
                    os.write(fd, m.text.encode())
                    os.lseek(fd, 0, os.SEEK_SET)
                    data_fds.append(fd)
                    args += ["--perms", "0444", "--ro-bind-data", str(fd), m.dest]
                else:
                    args += m.args()
            pass_fds += (seccomp_fd, *data_fds)
            cmd = [self.bwrap, *self._namespace_args(identity), "--seccomp", str(seccomp_fd), *args,
                   "--chdir", "/" if identity.mode == "host-uid" else str(workdir), "--clearenv",
                   *[a for k, v in full_env.items() for a in ("--setenv", k, v)], "--"]
            if identity.mode == "host-uid":
                cmd += [_python(), "-I", "-S", "-c", UID_SWITCH, str(identity.uid), str(identity.gid),
                        ",".join(map(str, identity.groups)), str(workdir)]
            cmd += argv
            limits["seccomp"] = True
            limits["identity"] = f"{identity.mode} uid {identity.uid}"
        pass_fds += tuple(extra_fds)
        limits["processes"] = "cgroup pids" if cgroup and "pids" in cgroup.dirs else "RLIMIT_NPROC"
        nproc = None if limits["processes"] == "cgroup pids" else self.pids_max
        watch = _DiskWatch([workdir, *rw], disk, cgroup)
        start, oom_kills = time.monotonic(), host_oom_kills()
        try:
            try:
                # bwrap gets the cleared environment too: it is PID 1 inside, and /proc/1/environ is readable there.
                proc = subprocess.Popen(cmd, cwd=workdir, env=full_env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True, pass_fds=pass_fds,
                                        preexec_fn=lambda: self._in_child(cgroup, limits, nproc))
            finally:
                for fd in pass_fds[2 if channel else 0:]:  # seccomp, /etc files, extra; the turn pipes are the channel's
                    os.close(fd)
                extra_fds.clear()
            if channel:
                channel.start()
            reaper = _Reaper(proc)
            out, err = _Drain(proc.stdout), _Drain(proc.stderr)
            pausable = _Pausable(proc, reaper, cgroup)
            unregister = quiet[0].pause_during_measurements(pausable, quiet[1]) if quiet else None
            ended = None
            try:
                ended = _wait(reaper, timeout_s, channel, watch, stop, pausable)
            finally:
                try:
                    if unregister:  # first: no measurement stops it again while it is being killed
                        unregister()
                finally:
                    # bwrap is the PID-namespace init: killing its group takes down every descendant, setsid or
                    # not; the cgroup catches whatever escaped (unsafe mode, a process that outlived its namespace).
                    _kill_group(proc, reaper)
                    if cgroup:
                        cgroup.kill_all()
            out.join(), err.join()
            events = cgroup.events() if cgroup else {}
            cpu_s = cgroup.cpu_seconds() if cgroup else None
            if cgroup:
                cgroup.remove()
            if ended == "disk" or (ended is None and watch.exceeded()):  # also what it wrote in its last 0.1 s
                events["disk_limit"] = watch.peak
            if identity is not None and identity.mode == "host-uid":
                _reclaim([workdir, *rw])
        finally:
            if uid_lock is not None:
                os.close(uid_lock)
        now = host_oom_kills()
        if oom_kills is not None and now is not None and now > oom_kills:
            # The kernel killed something for want of memory while this ran: the likely reason for a SIGKILL that no
            # limit of ours explains (the callers decide whose fault it is).
            events["host_oom_kills"] = now - oom_kills
        return JailResult(
            returncode=proc.returncode, timed_out=ended == "timeout", wall_s=time.monotonic() - start,
            stdout=out.text(), stderr=err.text(), jailed=not self.unsafe_no_jail,
            output_bytes=out.total + err.total, limit_events=events, limits=limits,
            cpu_s=cpu_s if cpu_s is not None else reaper.cpu_s, paused_s=round(pausable.paused_s(), 3),
        )

    def _identity(self, uid: int | None) -> Identity:
        if uid is None:
            return Identity("userns", os.geteuid(), os.getegid())
        groups = sorted({JAIL_GROUP, *self._gpu_groups()})
        return Identity("host-uid", uid, uid, tuple(groups), inside_uid=uid)

    def _namespace_args(self, identity: Identity) -> list[str]:
        args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session"]
        if identity.mode == "userns":
            return args + ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns",
                           "--cap-drop", "ALL"]
        # Privileged bubblewrap (the worker is root) in the host's user namespace: only what the switch to the jail
        # uid needs survives, and the switch drops it (UID_SWITCH).
        return args + ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                       "--cap-add", "CAP_SETPCAP"]

    def _memory_cap(self) -> int:
        """The memory limit, never more than 3/4 of the host's memory: a limit past what the host has would let a
        memory bomb drive the host into a global OOM before its own cgroup's limit binds."""
        total = _mem_total()
        return min(self.memory_bytes, total * 3 // 4) if total else self.memory_bytes

    def _cgroup(self, limits: dict) -> JobCgroup | None:
        try:
            cgroup = JobCgroup.create(self._memory_cap(), self.pids_max)
        except CgroupUnavailable as e:
            if not (self.unsafe_no_memory_limit or self.unsafe_no_jail):
                raise JailUnavailable(
                    f"no memory limit can be enforced on this host ({e}), so no candidate runs: a memory bomb would "
                    "take the host into a global OOM. Fix: run the worker as root or under systemd with "
                    "Delegate=yes (cgroup v2 with the memory controller delegated, or cgroup v1). Operator opt-out, "
                    "every verdict then stored as not memory-limited: APPLIANCE_UNSAFE_NO_MEMORY_LIMIT=1"
                ) from None
            limits["cgroup"] = f"unavailable: {e}"
            return None
        limits.update(memory_bytes=self._memory_cap(), pids_max=self.pids_max, cgroup=f"v{cgroup.version}")
        return cgroup

    def _limits(self, timeout_s: float, disk: int) -> dict:
        """The rlimits and caps of one run, for the record."""
        cpu = self.cpu_seconds or self._cpu_seconds(timeout_s)
        return {"cpu_seconds": cpu, "cpu_hard_seconds": cpu + CPU_GRACE_S,
                "file_bytes": min(self.max_file_bytes, disk), "open_files": self.open_files,
                "wall_seconds": timeout_s, "output_kept_bytes": OUTPUT_TAIL, "disk_bytes": disk,
                "scratch_bytes": self.scratch_bytes}

    def _cpu_seconds(self, timeout_s: float) -> int:
        # A backstop behind the wall clock: every core busy for the whole timeout, plus start-up.
        return int(timeout_s * (os.cpu_count() or 1) + 60)

    def _in_child(self, cgroup: JobCgroup | None, limits: dict, nproc: int | None) -> None:
        """Between fork and exec: join the job's cgroup first, then lower the rlimits (the user is dropped later)."""
        if cgroup:
            cgroup.join()
        _lower(resource.RLIMIT_CORE, 0, 0)
        _lower(resource.RLIMIT_FSIZE, limits["file_bytes"], limits["file_bytes"])
        _lower(resource.RLIMIT_NOFILE, self.open_files, self.open_files)
        _lower(resource.RLIMIT_CPU, limits["cpu_seconds"], limits["cpu_hard_seconds"])
        if nproc is not None:  # no pids controller: per uid, which is the jail's own (host-uid mode)
            _lower(resource.RLIMIT_NPROC, nproc, nproc)

    def _gpu_nodes(self) -> list[str]:
        if self.gpu is None:
            return []
        nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", gpu_identity(self.gpu)[0]]
        nodes += glob.glob("/dev/nvidia-caps/*")
        return [n for n in nodes if os.path.exists(n)]

    def _gpu_groups(self) -> set[int]:
        """The groups a jail uid needs for the GPU's device nodes where they are not open to everyone."""
        groups = set()
        for n in self._gpu_nodes():
            st = os.stat(n)
            if st.st_mode & 0o006 != 0o006 and st.st_gid != 0:
                groups.add(st.st_gid)
        return groups

    def _env(self, workdir: Path) -> dict[str, str]:
        tmp = str(workdir / "tmp")
        env = {
            # The interpreter's bin dir first: ninja (load_inline) and console tools live beside python.
            "PATH": ":".join([str(Path(sys.executable).parent), *_cuda_bin(), "/usr/local/bin:/usr/bin:/bin"]),
            "HOME": str(workdir),
            "USER": "jail",
            "LOGNAME": "jail",
            "TMPDIR": tmp,
            "TRITON_CACHE_DIR": f"{tmp}/triton",
            "TORCH_EXTENSIONS_DIR": f"{tmp}/torch_extensions",
            "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
            "CUDA_CACHE_PATH": f"{tmp}/cuda",
            "PYTHONPATH": ":".join([str(Path(sandbox.__file__).resolve().parent.parent), *map(str, _pythonpath())]),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": "" if self.gpu is None else gpu_identity(self.gpu)[1],
        }
        for key in ("LD_LIBRARY_PATH", "CUDA_HOME", "TRITON_PTXAS_PATH", "OMP_NUM_THREADS"):
            if key in os.environ:
                env[key] = os.environ[key]
        # One OpenMP thread unless the operator says otherwise: spinning OpenMP workers on cores shared with other
        # jobs made CPU timings of the same op swing between microseconds and milliseconds.
        env.setdefault("OMP_NUM_THREADS", "1")
        return env


def _python() -> str:
    return str(Path(sys.executable))


def _grant(identity: Identity, writable: list[Path], readable: list[Path]) -> None:
    """Before a host-uid jail runs: its writable folders become its own, its read-only ones readable by the jails'
    group (never by every user of the host: task code is confidential)."""
    _tree_command(["chown", "-R", "-h", f"{identity.uid}:{JAIL_GROUP}"], writable)
    _tree_command(["chgrp", "-R", "-h", str(JAIL_GROUP)], readable)
    _tree_command(["chmod", "-R", "g+rX"], readable)


def _reclaim(writable: list[Path]) -> None:
    """After a host-uid jail: what it wrote is the worker's again, readable by the jails' group (the check reads
    the candidate's outputs), with no set-id or execute bits on files (nothing a jail made runs as anyone)."""
    _tree_command(["chown", "-R", "-h", f"{os.geteuid()}:{JAIL_GROUP}"], writable)
    _tree_command(["chmod", "-R", "u=rw,g=r,o=,ug+X"], writable)


def _tree_command(argv: list[str], roots: list[Path]) -> None:
    """coreutils over whole trees: they never follow a link (chmod skips them, -h changes the link itself) and walk
    trees of any depth (a candidate can leave one too deep for os.walk's recursion and for PATH_MAX)."""
    roots = [str(r) for r in roots if os.path.lexists(r)]
    if roots:
        done = subprocess.run([*argv, "--", *roots], capture_output=True, text=True)
        if done.returncode != 0:
            raise JailUnavailable(f"{' '.join(argv)} on the job's folders failed: {done.stderr.strip()[:300]}")


class _DiskWatch:
    """What a job's writable folders hold, measured while it runs: past the cap, the job is killed (`disk_limit`).
    Counted: every file and folder under them, and files its processes deleted but hold open (space the folders no
    longer show). A folder that cannot be read (a path past PATH_MAX, a tree made unreadable) counts as past the cap:
    what cannot be measured is not allowed."""

    def __init__(self, roots: list[Path], cap: int, cgroup: JobCgroup | None = None):
        self.roots, self.cap, self.cgroup, self.peak = roots, cap, cgroup, 0
        self.devices = {os.stat(r).st_dev for r in roots if os.path.exists(r)}

    def exceeded(self) -> bool:
        try:
            used, entries = self._tree()
        except _Unmeasurable:
            return True
        used += self._deleted_but_open()
        self.peak = max(self.peak, used)
        return used > self.cap or entries > DISK_MAX_ENTRIES

    def _tree(self) -> tuple[int, int]:
        used, entries, stack = 0, 0, [str(r) for r in self.roots]
        while stack:
            try:
                with os.scandir(stack.pop()) as it:
                    for e in it:
                        entries += 1
                        try:
                            st = e.stat(follow_symlinks=False)
                        except FileNotFoundError:  # removed since it was listed
                            continue
                        used += st.st_blocks * 512
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                if entries > DISK_MAX_ENTRIES:
                    break
            except FileNotFoundError:
                continue
            except OSError as e:
                raise _Unmeasurable(str(e)) from None
        return used, entries

    def _deleted_but_open(self) -> int:
        """Bytes of files on the folders' file systems that the job's processes deleted and keep open."""
        if self.cgroup is None:
            return 0
        held, seen = 0, set()
        for pid in self.cgroup.pids():
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if st.st_nlink == 0 and st.st_dev in self.devices and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    held += st.st_blocks * 512
        return held


class _Unmeasurable(Exception):
    pass


class _Reaper:
    """Waits for the jail's process on a thread, keeping the CPU time of its reaped tree (os.wait4; bubblewrap does
    not pass its children's on, so for a jail the cgroup's count is used)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.done, self.cpu_s = proc, threading.Event(), None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            _, status, usage = os.wait4(self.proc.pid, 0)
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self.cpu_s = usage.ru_utime + usage.ru_stime
        except ChildProcessError:
            self.proc.returncode = -signal.SIGKILL if self.proc.returncode is None else self.proc.returncode
        finally:
            self.done.set()


class _Pausable:
    """One jailed process tree, stopped while another evaluation measures (sandbox/gate.py): its job cgroup frozen
    (v2, or v1's freezer controller), else its process group stopped (a host without a freezer, unsafe modes:
    `setsid` escapes that)."""

    def __init__(self, proc: subprocess.Popen, reaper: _Reaper, cgroup: JobCgroup | None):
        self.proc, self.reaper, self.cgroup = proc, reaper, cgroup
        self.total, self.since = 0.0, None

    def pause(self) -> None:
        if self.since is None:
            self.since = time.monotonic()
            self._signal(True)

    def resume(self) -> None:
        if self.since is not None:
            self._signal(False)
            self.total += time.monotonic() - self.since
            self.since = None

    def paused_s(self) -> float:
        since = self.since
        return self.total + (time.monotonic() - since if since is not None else 0.0)

    def _signal(self, stop: bool) -> None:
        """(A failure, the tree gone meanwhile, is the gate's to swallow: sandbox/gate.py `_quietly`.)"""
        if self.cgroup is not None and self.cgroup.freeze(stop):
            return
        if not self.reaper.done.is_set():  # (once reaped, its pid may be someone else's)
            os.killpg(self.proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)


PAUSED_BACKSTOP = 4  # seconds stopped extend a deadline by at most this many timeouts
_GROUPS = itertools.count()  # a fresh group per jailed run that names none


def _mem_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_oom_kills() -> int | None:
    """The kernel's count of OOM kills on this host since boot (/proc/vmstat, Linux 4.13+), or None."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


@functools.cache
def gpu_identity(index: int) -> tuple[str, str]:
    """GPU `index` (nvidia-smi's numbering) as (its device node, what CUDA_VISIBLE_DEVICES must say in the jail).
    Only that GPU's node is bound into the jail, so CUDA there sees one device: "1" would name none (seen on a
    two-GPU H200). The UUID names it whatever CUDA enumerates; without NVML, the only device is device 0."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        node = f"/dev/nvidia{pynvml.nvmlDeviceGetMinorNumber(handle)}"
        return node, uuid.decode() if isinstance(uuid, bytes) else uuid
    except Exception:  # noqa: BLE001 - no NVML: device nodes are numbered like nvidia-smi's indices
        return f"/dev/nvidia{index}", "0"


def _python_paths() -> list[Path]:
    """The interpreter and every import root it uses (venv, base install, user site-packages)."""
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent}
    roots |= {Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()}
    roots |= set(_pythonpath())
    roots = {p.resolve() for p in roots if p.exists()}
    keep = [p for p in roots if not any(str(p).startswith(s + "/") or str(p) == s for s in jail_policy.SYSTEM_DIRS)]
    # Drop paths nested in another kept root, and never expose a whole home or working directory root.
    keep = [p for p in keep if not any(q != p and p.is_relative_to(q) for q in keep)]
    pkg_parent = Path(sandbox.__file__).resolve().parent.parent
    if pkg_parent.name in ("site-packages", "dist-packages"):
        return sorted(keep)  # an installed wheel: the venv is the installation, mount it whole
    # A source checkout: never mount the checkout (or a folder holding it); the sandbox package is bound alone.
    return sorted(p for p in keep if p != pkg_parent and not pkg_parent.is_relative_to(p))


def _pythonpath() -> list[Path]:
    """Package folders the controller was given through PYTHONPATH (e.g. an offline install with --target): the
    harness needs the same ones. Never a home directory or the root."""
    entries = [Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(":") if p]
    pkg_parent = Path(sandbox.__file__).resolve().parent.parent
    banned = {Path("/"), Path.home().resolve(), pkg_parent}
    return [p for p in dict.fromkeys(entries) if p.is_dir() and p not in banned]


def _cuda_bin() -> list[str]:
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return [f"{home}/bin"] if os.path.isdir(f"{home}/bin") else []


def _kill_group(proc: subprocess.Popen, reaper: _Reaper) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    reaper.done.wait()


def _lower(limit: int, soft: int, hard: int) -> None:
    """Set the limit, never above the current hard limit (we cannot raise it)."""
    _, current = resource.getrlimit(limit)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(limit, (soft, hard))


class _Drain:
    """Reads a pipe to the end on a thread, keeping only the last OUTPUT_TAIL bytes: a flood costs no memory."""

    def __init__(self, pipe):
        self.pipe, self.total, self.kept = pipe, 0, bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while chunk := self.pipe.read1(1 << 16):
            self.total += len(chunk)
            self.kept += chunk
            if len(self.kept) > 2 * OUTPUT_TAIL:
                del self.kept[:-OUTPUT_TAIL]
        self.pipe.close()

    def join(self) -> None:
        self.thread.join(timeout=5)

    def text(self) -> str:
        return bytes(self.kept[-OUTPUT_TAIL:]).decode(errors="replace")


def _wait(reaper: _Reaper, timeout_s: float, channel: TurnChannel | None, disk: _DiskWatch,
          stop: threading.Event | None = None, pausable: _Pausable | None = None) -> str | None:
    """Wait for the process for `timeout_s` of its own time, measuring its writable folders as it goes: None when it
    ended, "timeout" or "disk" when it must be killed. Seconds it waited to be admitted to the device's memory, or
    stopped while others measured (sandbox/gate.py), are the other evaluations' doing, not its own: they extend the
    deadline (admission up to `timeout_s` more, a backstop should it never come; stops, which the gate bounds per
    measurement, up to PAUSED_BACKSTOP times `timeout_s`)."""
    start = time.monotonic()
    while True:
        admission = min(channel.record.admission_s(), timeout_s) if channel else 0.0
        queued = admission + (min(pausable.paused_s(), PAUSED_BACKSTOP * timeout_s) if pausable else 0.0)
        remaining = start + timeout_s + queued - time.monotonic()
        if remaining <= 0:
            return "timeout"
        if reaper.done.wait(min(remaining, DISK_POLL_S)):
            return None
        if stop is not None and stop.is_set():
            return "stopped"
        if disk.exceeded():
            return "disk"
