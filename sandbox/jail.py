"""Run one harness process in a bubblewrap jail; fail closed when the jail cannot be built.

What this first version enforces: own network namespace (only `lo`), own PID/IPC/UTS namespaces, an
unprivileged user with no capabilities, a read-only minimal view of the system (system dirs, the Python
installation, the harness package) plus the job's own directories, a private /tmp, only the assigned GPU's
device node, a cleared environment, rlimits, and a wall-clock timeout that kills the whole tree.
(The seccomp filter and cgroup limits come with the sandbox issue.)

`unsafe_no_jail=True` runs the same command as a plain subprocess, for development on hosts without
bubblewrap; callers must mark every result produced that way.
"""

from __future__ import annotations

import glob
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import sandbox

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", "/sys", "/opt/nvidia")
OUTPUT_TAIL = 20_000


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
    max_file_bytes: int = 16 << 30

    def check(self) -> None:
        """Raise JailUnavailable with a fix hint unless bubblewrap works here."""
        if self.unsafe_no_jail:
            return
        if not self.bwrap or not os.access(self.bwrap, os.X_OK):
            raise JailUnavailable(
                f"bubblewrap (bwrap) not found{f' at {self.bwrap}' if self.bwrap else ''}: candidates cannot be "
                "jailed. Install it "
                "(Debian/Ubuntu: apt-get install bubblewrap) or set APPLIANCE_BWRAP to its path. "
                "For development only, --unsafe-no-jail runs candidates unjailed."
            )
        probe = subprocess.run([self.bwrap, *self._base_args(), "--", "/bin/true"], capture_output=True, text=True)
        if probe.returncode != 0:
            raise JailUnavailable(
                f"bubblewrap at {self.bwrap} cannot create the jail: {probe.stderr.strip()[:500]}. It needs user "
                "and network namespaces (check kernel.unprivileged_userns_clone / user.max_user_namespaces, "
                "or run the worker as root)."
            )

    def run(self, argv: list[str], *, workdir: Path, ro: list[Path] = (), rw: list[Path] = (),
            env: dict[str, str] | None = None, timeout_s: float = 600.0, log_dir: Path | None = None) -> JailResult:
        """Run argv with `workdir` (writable, also HOME/TMPDIR/caches), `rw` writable and `ro` read-only paths."""
        workdir = Path(workdir)
        (workdir / "tmp").mkdir(parents=True, exist_ok=True)
        full_env = self._env(workdir) | (env or {})
        if self.unsafe_no_jail:
            cmd = argv
        else:
            self.check()
            cmd = [self.bwrap, *self._base_args(), *self._bind_args(workdir, ro, rw), "--chdir", str(workdir),
                   "--clearenv", *[a for k, v in full_env.items() for a in ("--setenv", k, v)], "--", *argv]
        log_dir = Path(log_dir or workdir)
        out_path, err_path = log_dir / "stdout.log", log_dir / "stderr.log"
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=workdir, env=full_env if self.unsafe_no_jail else None,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True, preexec_fn=self._limits)
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # bwrap is the PID-namespace init: killing its group takes down every descendant, setsid or not.
                _kill_group(proc)
        return JailResult(
            returncode=proc.returncode, timed_out=timed_out, wall_s=time.monotonic() - start,
            stdout=_tail(out_path), stderr=_tail(err_path), jailed=not self.unsafe_no_jail,
        )

    def _base_args(self) -> list[str]:
        args = ["--unshare-all", "--die-with-parent", "--new-session",
                "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
        for d in SYSTEM_DIRS:
            args += ["--ro-bind-try", d, d]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
        for path in _python_paths():
            args += ["--ro-bind", str(path), str(path)]
        pkg = Path(sandbox.__file__).resolve().parent
        args += ["--ro-bind", str(pkg), str(pkg)]
        args += self._gpu_args()
        return args

    def _gpu_args(self) -> list[str]:
        if self.gpu is None:
            return []
        nodes = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", f"/dev/nvidia{self.gpu}"]
        nodes += glob.glob("/dev/nvidia-caps/*")
        return [a for n in nodes if os.path.exists(n) for a in ("--dev-bind", n, n)]

    @staticmethod
    def _bind_args(workdir: Path, ro, rw) -> list[str]:
        args = ["--bind", str(workdir), str(workdir)]
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
            "PYTHONPATH": str(Path(sandbox.__file__).resolve().parent.parent),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "CUDA_VISIBLE_DEVICES": "" if self.gpu is None else str(self.gpu),
        }
        for key in ("LD_LIBRARY_PATH", "CUDA_HOME", "TRITON_PTXAS_PATH", "OMP_NUM_THREADS"):
            if key in os.environ:
                env[key] = os.environ[key]
        return env

    def _limits(self) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        cap = self.max_file_bytes if hard == resource.RLIM_INFINITY else min(self.max_file_bytes, hard)
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))


def _python_paths() -> list[Path]:
    """The interpreter and every import root it uses (venv, base install, user site-packages)."""
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent}
    roots |= {Path(p) for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()}
    roots = {p.resolve() for p in roots if p.exists()}
    keep = [p for p in roots if not any(str(p).startswith(s + "/") or str(p) == s for s in SYSTEM_DIRS)]
    # Drop paths nested in another kept root, and never expose a whole home or working directory root.
    keep = [p for p in keep if not any(q != p and p.is_relative_to(q) for q in keep)]
    pkg_parent = Path(sandbox.__file__).resolve().parent.parent
    return sorted(p for p in keep if p != pkg_parent and not pkg_parent.is_relative_to(p))


def _cuda_bin() -> list[str]:
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return [f"{home}/bin"] if os.path.isdir(f"{home}/bin") else []


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - OUTPUT_TAIL))
        return f.read().decode(errors="replace")
