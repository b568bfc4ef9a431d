"""Where evaluations keep their files, and what is left of a process that was killed.

An evaluation's job folder holds gigabytes at full size (inputs, outputs), on a tmpfs on a GPU host
(APPLIANCE_JOBS_DIR): a process that ends normally removes its folders, but one killed with SIGKILL (an OOM kill,
`kill -9`, a crashed host on a disk root) leaves them behind, in memory until the next reboot. So each pipeline keeps
its folders inside one folder of its own in the jobs root, `appliance-jobs-PID-XXXX/`, and holds an exclusive
`flock` on the `.owner` file inside it for as long as it lives: the kernel drops the lock when the process dies,
however it dies. Whoever claims a folder next sweeps the root first: a claimed folder whose lock can be taken has no
owner left, and is removed. Nothing else in the root is touched (a folder without an `.owner` file, one whose lock
is held, anything not named like ours).
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

PREFIX = "appliance-jobs-"
OWNER = ".owner"


class JobFolder:
    """One pipeline's folder in the jobs root (`root`; None: the system's temporary folder), claimed on first use
    and removed, with everything in it, by `release`."""

    def __init__(self, root: Path | None):
        self.root = Path(root) if root is not None else Path(tempfile.gettempdir())
        self._path: Path | None = None
        self._fd: int | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        with self._lock:
            if self._path is None or not self._path.is_dir():
                self._claim()
            return self._path

    def _claim(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        sweep(self.root)
        # Made under a name the sweep ignores and renamed once locked: a sweep in between never sees it unlocked.
        staging = Path(tempfile.mkdtemp(prefix=".claiming-", dir=self.root))
        fd = os.open(staging / OWNER, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())
        path = self.root / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(staging, path)
        if self._fd is not None:
            os.close(self._fd)
        self._path, self._fd = path, fd

    def release(self) -> None:
        """Remove the folder and everything in it, then drop the lock (the next use claims a new one)."""
        with self._lock:
            if self._path is not None:
                remove_tree(self._path)
            if self._fd is not None:
                os.close(self._fd)
            self._path, self._fd = None, None


def sweep(root: Path) -> list[Path]:
    """Remove the claimed folders in `root` whose owners are gone; returns them."""
    removed = []
    try:
        entries = list(Path(root).iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX) or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            fd = os.open(entry / OWNER, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # no lock file: not one of ours, or being removed by another sweep
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                continue  # its owner is alive
            raise
        try:
            remove_tree(entry)  # the lock file goes last with it: until then no other sweep can take it
            removed.append(entry)
        finally:
            os.close(fd)
    return removed


def remove_tree(path: Path) -> None:
    """rm -rf for folders a candidate wrote into: shutil.rmtree recurses in Python (3.11), so a tree a few thousand
    levels deep raises RecursionError, which ignore_errors does not cover; rm does not recurse on the stack."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--", str(path)], check=False)
