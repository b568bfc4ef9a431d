"""The jail's system-call filter, built with libseccomp (through pyseccomp) and handed to bubblewrap as BPF.

Default allow, with a deny list chosen so that torch, Triton, CUDA, nvcc/ptxas and gcc keep working
(measured: ../shared/NOTES.md). Calls that only an escape or an attack needs kill the process (SIGSYS);
calls a library might probe harmlessly fail with EPERM instead.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile

# Namespace creation through clone(2) flags; clone3 gets ENOSYS so glibc falls back to clone, which we can inspect.
_CLONE_NEW = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
              "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
              "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080}
TIOCSTI = 0x5412

KILLED = ("ptrace", "process_vm_readv", "process_vm_writev", "bpf", "init_module", "finit_module", "delete_module",
          "kexec_load", "kexec_file_load")
DENIED = ("mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "keyctl", "add_key", "request_key",
          "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register", "swapon", "swapoff", "reboot",
          "open_by_handle_at", "fanotify_init", "userfaultfd", "move_mount", "open_tree", "fsopen", "fsmount")


class SeccompUnavailable(RuntimeError):
    pass


def build_filter():
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as e:  # the package, or libseccomp.so under it
        raise SeccompUnavailable(f"pyseccomp/libseccomp not usable: {e}. Install libseccomp2 (apt-get install "
                                 "libseccomp2) and the Python package pyseccomp.") from None
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in KILLED:
        _add(f, sc.KILL_PROCESS, name)
    for name in DENIED:
        _add(f, eperm, name)
    # Only local (AF_UNIX) sockets: no IP, no netlink, no raw packets, even though the netns has only lo.
    _add(f, eperm, "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
    for flag in _CLONE_NEW.values():
        _add(f, eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    _add(f, sc.ERRNO(errno.ENOSYS), "clone3")
    _add(f, eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))  # no typing into the caller's terminal
    return f


def _add(f, action, name: str, *args) -> None:
    """A rule that cannot be installed is an error, never skipped: a misspelled or unknown system call would
    otherwise drop its rule silently and the jail would run without it."""
    try:
        f.add_rule(action, name, *args)
    except Exception as e:  # noqa: BLE001 - libseccomp reports an unknown name or a bad rule as OSError(EINVAL)
        raise SeccompUnavailable(f"seccomp rule for {name!r} cannot be installed ({e}): the jail does not start "
                                 "without it") from None


def policy() -> dict:
    """The filter as data, for the jail's policy value (sandbox/policy.py) and `appliance doctor`."""
    return {"default": "allow", "kill": list(KILLED), "eperm": list(DENIED),
            "socket": "AF_UNIX only (others EPERM)", "clone": "namespace flags EPERM", "clone3": "ENOSYS",
            "ioctl": "TIOCSTI EPERM"}


def bpf_file() -> int:
    """The compiled filter in an unlinked temp file, rewound: a file descriptor for `bwrap --seccomp FD`."""
    f = build_filter()
    fd, path = tempfile.mkstemp(prefix="appliance-seccomp-")
    os.unlink(path)
    with os.fdopen(os.dup(fd), "wb") as out:
        f.export_bpf(out)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
