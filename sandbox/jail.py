"""Run one harness process in a bubblewrap jail; fail closed when the jail cannot be built.

Enforced: own network namespace (only `lo`) and a seccomp filter (sandbox/seccomp.py) that also refuses IP and
netlink sockets; own PID/IPC/UTS namespaces; an unprivileged user with no capabilities and no new privileges;
a read-only minimal view of the system (system dirs, the Python installation, the harness package) plus the
job's own directories, a private /tmp and private caches; only the assigned GPU's device nodes; a cleared
environment; a memory and a process limit (sandbox/cgroup.py, where the host has cgroups); rlimits on CPU time,
file size, open files and core dumps; captured output capped; a wall-clock timeout that kills the whole tree.

`unsafe_no_jail=True` runs the same command as a plain subprocess (limits still apply), for development on
hosts without bubblewrap; callers must mark every result produced that way.
"""

from __future__ import annotations

import functools
import glob
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import sandbox
from sandbox.cgroup import CgroupUnavailable, JobCgroup
from sandbox.gate import DeviceGate, TurnChannel, TurnRecord
from sandbox.seccomp import SeccompUnavailable, bpf_file

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", "/sys", "/opt/nvidia")
OUTPUT_TAIL = 64 << 10  # bytes of stdout/stderr kept per process; the rest is counted and dropped


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
    limit_events: dict = field(default_factory=dict)  # {"oom_kill": n, "pids_max": n} from the job's cgroup
    limits: dict = field(default_factory=dict)  # what was enforced, for the record
    turns: dict | None = None  # device turns taken (sandbox/gate.py): waited, held, joules while held

    @property
    def signal(self) -> int | None:
        """The signal that ended the process: bwrap reports its child's death by signal N as exit 128+N."""
        rc = self.returncode
        if rc is None:
            return None
        if rc < 0:
            return -rc
        return rc - 128 if self.jailed and 128 < rc < 160 else None


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
    use_cgroups: bool = True  # where the host has them; `limits` in each result says whether they applied
    _checked: bool = field(default=False, init=False, repr=False)

    def check(self) -> None:
        """Raise JailUnavailable with a fix hint unless bubblewrap works here."""
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
            seccomp_fd = bpf_file()
        except SeccompUnavailable as e:
            raise JailUnavailable(str(e)) from None
        try:
            probe = subprocess.run([self.bwrap, *self._base_args(), "--seccomp", str(seccomp_fd), "--", "/bin/true"],
                                   capture_output=True, text=True, pass_fds=(seccomp_fd,))
        finally:
            os.close(seccomp_fd)
        if probe.returncode != 0:
            raise JailUnavailable(
                f"bubblewrap at {self.bwrap} cannot create the jail: {probe.stderr.strip()[:500]}. It needs user "
                "and network namespaces (check kernel.unprivileged_userns_clone / user.max_user_namespaces, "
                "or run the worker as root)."
            )
        self._checked = True

    def run(self, argv: list[str], *, workdir: Path, ro: list[Path] = (), rw: list[Path] = (),
            env: dict[str, str] | None = None, timeout_s: float = 600.0, gate: DeviceGate | None = None,
            exclusive: bool = False, resident_bytes: int | None = 0) -> JailResult:
        """Run argv with `workdir` (writable, also HOME/TMPDIR/caches), `rw` writable and `ro` read-only paths.

        With a `gate`, the process takes turns on the device (sandbox/gate.py): it asks for them itself, or, with
        `exclusive`, holds one from start to end. It holds `resident_bytes` of device memory while resident (None:
        the whole device); with `exclusive`, from start to end too."""
        workdir = Path(workdir)
        (workdir / "tmp").mkdir(parents=True, exist_ok=True)
        channel = gate.open_channel(resident_bytes) if gate is not None and not exclusive else None
        full_env = self._env(workdir) | (env or {}) | (channel.env() if channel else {})
        limits = {"cpu_seconds": self._cpu_seconds(timeout_s), "file_bytes": self.max_file_bytes,
                  "open_files": self.open_files, "wall_seconds": timeout_s, "output_kept_bytes": OUTPUT_TAIL}
        cgroup = self._cgroup(limits)
        record, held = TurnRecord(), None
        if gate is not None and exclusive:
            gate.admit(record, resident_bytes)
        try:
            if gate is not None and exclusive:
                held = gate.acquire(record)
            result = self._run(argv, workdir, ro, rw, full_env, timeout_s, limits, cgroup, channel)
        except BaseException:
            if channel:
                channel.close_unstarted()  # nothing was started (no jail, no fork): no pipe may leak
            raise
        finally:
            if held is not None:
                gate.release(record, held)
            if gate is not None and exclusive:
                gate.leave(record)
        if channel:
            record = channel.join()
        result.turns = record.as_dict() if gate is not None else None
        return result

    def _run(self, argv, workdir: Path, ro, rw, full_env: dict, timeout_s: float, limits: dict,
             cgroup: JobCgroup | None, channel: TurnChannel | None) -> JailResult:
        pass_fds: tuple[int, ...] = channel.child_fds if channel else ()
        if self.unsafe_no_jail:
            cmd = argv
        else:
            self.check()
            seccomp_fd = bpf_file()
            pass_fds += (seccomp_fd,)
            cmd = [self.bwrap, *self._base_args(), "--seccomp", str(seccomp_fd),
                   *self._bind_args(workdir, ro, rw), "--chdir", str(workdir),
                   "--clearenv", *[a for k, v in full_env.items() for a in ("--setenv", k, v)], "--", *argv]
            limits["seccomp"] = True
        start, oom_kills = time.monotonic(), host_oom_kills()
        try:
            # bwrap gets the cleared environment too: it is PID 1 inside, and /proc/1/environ is readable there.
            proc = subprocess.Popen(cmd, cwd=workdir, env=full_env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, pass_fds=pass_fds,
                                    preexec_fn=lambda: self._in_child(cgroup, limits["cpu_seconds"]))
        finally:
            for fd in pass_fds[2 if channel else 0:]:  # the seccomp filter; the turn pipes are the channel's
                os.close(fd)
        if channel:
            channel.start()
        out, err = _Drain(proc.stdout), _Drain(proc.stderr)
        timed_out = False
        try:
            _wait(proc, timeout_s, channel)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # bwrap is the PID-namespace init: killing its group takes down every descendant, setsid or not;
            # the cgroup catches whatever escaped (unsafe mode, or a process that outlived its namespace).
            _kill_group(proc)
            if cgroup:
                cgroup.kill_all()
        out.join(), err.join()
        events = cgroup.events() if cgroup else {}
        if cgroup:
            cgroup.remove()
        now = host_oom_kills()
        if oom_kills is not None and now is not None and now > oom_kills:
            # The kernel killed something for want of memory while this ran: the likely reason for a SIGKILL that no
            # limit of ours explains (the callers decide whose fault it is).
            events["host_oom_kills"] = now - oom_kills
        return JailResult(
            returncode=proc.returncode, timed_out=timed_out, wall_s=time.monotonic() - start,
            stdout=out.text(), stderr=err.text(), jailed=not self.unsafe_no_jail,
            output_bytes=out.total + err.total, limit_events=events, limits=limits,
        )

    def _cgroup(self, limits: dict) -> JobCgroup | None:
        if not self.use_cgroups:
            return None
        try:
            cgroup = JobCgroup.create(self.memory_bytes, self.pids_max)
        except CgroupUnavailable as e:
            limits["cgroup"] = f"unavailable: {e}"
            return None
        limits.update(memory_bytes=self.memory_bytes, pids_max=self.pids_max, cgroup=f"v{cgroup.version}")
        return cgroup

    def _cpu_seconds(self, timeout_s: float) -> int:
        # A backstop behind the wall clock: every core busy for the whole timeout, plus start-up.
        return int(timeout_s * (os.cpu_count() or 1) + 60)

    def _in_child(self, cgroup: JobCgroup | None, cpu_seconds: int) -> None:
        """Between fork and exec: join the job's cgroup first, then lower the rlimits (bwrap drops the user)."""
        if cgroup:
            cgroup.join()
        _lower(resource.RLIMIT_CORE, 0)
        _lower(resource.RLIMIT_FSIZE, self.max_file_bytes)
        _lower(resource.RLIMIT_NOFILE, self.open_files)
        _lower(resource.RLIMIT_CPU, cpu_seconds)

    def _base_args(self) -> list[str]:
        args = ["--unshare-all", "--die-with-parent", "--new-session",
                "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
        for d in SYSTEM_DIRS:
            args += ["--ro-bind-try", d, d]
        size = ["--size", str(self.scratch_bytes)]  # tmpfs pages also count against the job's memory cgroup
        args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp", *size, "--tmpfs", "/dev/shm"]
        for path in _python_paths():
            args += ["--ro-bind", str(path), str(path)]
        pkg = Path(sandbox.__file__).resolve().parent
        args += ["--ro-bind", str(pkg), str(pkg)]
        args += self._gpu_args()
        return args

    def _gpu_args(self) -> list[str]:
        if self.gpu is None:
            return []
        nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", gpu_identity(self.gpu)[0]]
        nodes += glob.glob("/dev/nvidia-caps/*")
        return [a for n in nodes if os.path.exists(n) for a in ("--dev-bind", n, n)]

    def _bind_args(self, workdir: Path, ro, rw) -> list[str]:
        # The job's scratch (TMPDIR, compiler caches) is a size-capped tmpfs: no filling the host's disk from there.
        args = ["--bind", str(workdir), str(workdir), "--size", str(self.scratch_bytes), "--tmpfs", str(workdir / "tmp")]
        for p in rw:
            args += ["--bind", str(p), str(p)]
        for p in ro:
            args += ["--ro-bind", str(p), str(p)]
        return args

    def _env(self, workdir: Path) -> dict[str, str]:
        tmp = str(workdir / "tmp")
        env = {
            # The interpreter's bin dir first: ninja (load_inline) and console tools live beside python.
            "PATH": ":".join([str(Path(sys.executable).parent), *_cuda_bin(), "/usr/local/bin:/usr/bin:/bin"]),
            "HOME": str(workdir),
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
    keep = [p for p in roots if not any(str(p).startswith(s + "/") or str(p) == s for s in SYSTEM_DIRS)]
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


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _lower(limit: int, value: int) -> None:
    """Set soft and hard limit to `value`, never above the current hard limit (we cannot raise it)."""
    _, hard = resource.getrlimit(limit)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(limit, (value, value))


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


def _wait(proc: subprocess.Popen, timeout_s: float, channel: TurnChannel | None) -> None:
    """Wait for `proc` for `timeout_s` of its own time. Seconds it waited to be admitted to the device's memory
    (sandbox/gate.py) are the other evaluations' doing, not its own: they extend the deadline, up to `timeout_s`
    more (a backstop should admission never come)."""
    start = time.monotonic()
    while True:
        queued = min(channel.record.admission_s(), timeout_s) if channel else 0.0
        remaining = start + timeout_s + queued - time.monotonic()
        if remaining <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        try:
            proc.wait(timeout=min(remaining, 1.0) if channel else remaining)
            return
        except subprocess.TimeoutExpired:
            continue
