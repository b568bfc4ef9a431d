"""The jail's whole policy as one value, like nsjail's config: what is mounted, which identity the process gets, its
rlimits, cgroup limits and system-call filter. `Jail` builds it, `render` turns it into bubblewrap's arguments, and
`appliance doctor` prints the same value, so the documentation of the jail cannot drift from what it does.
"""

from __future__ import annotations

import glob
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

# System directories, read-only. Not /etc and not /sys: of those only an allowlist (below) is visible.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/opt/nvidia")
# What Python, torch, CUDA, Triton and gcc read in /etc: the loader's cache and configuration (Triton finds libcuda
# through `ldconfig -p`), Debian's alternatives (/usr/bin/cc is a link through /etc/alternatives), the time zone and
# the OS release. passwd, group and hosts are written for the jail (`etc_files`). Never the rest: shadow files,
# /etc/appliance (database password, LLM key), ssh keys, sudoers.
ETC_ALLOWLIST = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
                 "/etc/os-release", "/etc/nsswitch.conf")
# What torch and the CUDA driver read in /sys: CPU and NUMA topology, the PCI devices (the GPU's bus, NUMA node and
# BARs), the huge-page setting; read-only. Not the cgroup tree, firmware, kernel security or debug files.
SYS_ALLOWLIST = ("/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/bus/pci",
                 "/sys/kernel/mm/transparent_hugepage", "/sys/module/nvidia")
SYS_PCI_GLOB = "/sys/devices/pci*"  # the targets of /sys/bus/pci/devices/* links
JAIL_HOME = "/nonexistent"  # passwd's home for the jail's user; HOME itself is the job's folder


@dataclass(frozen=True)
class Mount:
    kind: str  # ro-bind | bind | dev-bind | tmpfs | proc | dev | dir | data
    dest: str
    source: str = ""  # ro-bind, bind, dev-bind
    size: int | None = None  # tmpfs: bytes
    text: str = ""  # data: the file's content (a file the jail gets read-only, written by us)
    optional: bool = False  # ro-bind/dev-bind of something a host may not have (skipped when missing)

    def args(self) -> list[str]:
        if self.kind in ("ro-bind", "bind", "dev-bind"):
            return [f"--{self.kind}{'-try' if self.optional else ''}", self.source, self.dest]
        if self.kind == "tmpfs":
            # Sticky and open to all: the jail's uid is not the one that mounts it (privileged bubblewrap).
            return ["--perms", "1777", *(["--size", str(self.size)] if self.size else []), "--tmpfs", self.dest]
        if self.kind in ("proc", "dev"):
            return [f"--{self.kind}", self.dest]
        if self.kind == "dir":
            return ["--perms", "0755", "--dir", self.dest]
        raise ValueError(f"mount kind {self.kind!r} is rendered by the jail (it needs a file descriptor)")


@dataclass(frozen=True)
class Identity:
    """Who the jailed process is on the host. `host-uid`: a worker running as root starts bubblewrap privileged and
    the process switches to an unprivileged host uid of its own (one per jail at a time, from a range), so nothing in
    the jail is host root, and per-uid limits (RLIMIT_NPROC) count that jail alone. `userns`: an unprivileged worker;
    uid 65534 in a user namespace, mapped to the worker's own uid."""

    mode: str  # host-uid | userns
    uid: int  # the process's uid as the host sees it
    gid: int
    groups: tuple[int, ...] = ()  # supplementary groups (the jails' shared group; the GPU nodes' group)
    inside_uid: int = 65534  # the uid the process sees (host-uid mode: the same as uid)


@dataclass(frozen=True)
class Policy:
    identity: Identity
    namespaces: tuple[str, ...]
    mounts: tuple[Mount, ...]
    rlimits: dict  # name -> (soft, hard)
    cgroup: dict  # memory_bytes, pids_max, what enforces each
    disk_bytes: int  # what the job's writable folders may hold in all
    seccomp: dict  # sandbox/seccomp.py's lists
    environment: tuple[str, ...]  # the names of the variables the process gets (the environment is cleared)
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict:
        return asdict(self)


def system_mounts(python_paths: list[Path], package: Path, gpu_nodes: list[str], scratch_bytes: int,
                  etc_files: dict[str, str]) -> list[Mount]:
    """The mounts every jailed process gets (the job's own folders are added per run)."""
    mounts = [Mount("ro-bind", d, d, optional=True) for d in SYSTEM_DIRS]
    mounts += [Mount("ro-bind", p, p, optional=True) for p in ETC_ALLOWLIST]
    mounts += [Mount("data", path, text=text) for path, text in etc_files.items()]
    sys_dirs = [*SYS_ALLOWLIST, *sorted(glob.glob(SYS_PCI_GLOB))]
    mounts += [Mount("ro-bind", p, p, optional=True) for p in sys_dirs]
    mounts += [Mount("proc", "/proc"), Mount("dev", "/dev"), Mount("tmpfs", "/tmp", size=scratch_bytes),
               Mount("tmpfs", "/dev/shm", size=scratch_bytes)]
    mounts += [Mount("ro-bind", str(p), str(p)) for p in python_paths]
    mounts.append(Mount("ro-bind", str(package), str(package)))
    mounts += [Mount("dev-bind", n, n) for n in gpu_nodes]
    return mounts


def job_mounts(workdir: Path, ro, rw, scratch_bytes: int) -> list[Mount]:
    """The job's folders: its workdir (HOME) with a size-capped tmpfs for TMPDIR and caches, rw and ro folders."""
    mounts = [Mount("bind", str(workdir), str(workdir)), Mount("tmpfs", str(workdir / "tmp"), size=scratch_bytes)]
    mounts += [Mount("bind", str(p), str(p)) for p in rw]
    mounts += [Mount("ro-bind", str(p), str(p)) for p in ro]
    return mounts


def with_parents(mounts: list[Mount]) -> list[Mount]:
    """Each mount's missing parent directories made first, world-traversable: bubblewrap otherwise creates them
    with the mode of the host's (0700 for /root), and a jail uid that is not the owner could not reach its own
    Python or job folder. Parents inside a bind come from the host as they are."""
    made = {"/", "/dev", "/proc", "/tmp", "/sys", "/etc"}
    out = [Mount("dir", "/etc"), Mount("dir", "/sys")]
    for m in mounts:
        parents = [str(p) for p in reversed(Path(m.dest).parents)]
        for p in parents:
            if p not in made and not any(p == x.dest or p.startswith(x.dest.rstrip("/") + "/")
                                         for x in out if x.kind in ("bind", "ro-bind", "dev-bind")):
                out.append(Mount("dir", p))
                made.add(p)
        out.append(m)
    return out


def describe(policy: Policy) -> list[str]:
    """The same value as lines for a person (`appliance doctor`): every mount, limit and rule, none restated."""
    ident = policy.identity
    who = (f"host uid {ident.uid}.. (one per jail; the worker is root), groups {list(ident.groups)}"
           if ident.mode == "host-uid" else f"uid {ident.inside_uid} in a user namespace mapped to uid {ident.uid}")
    lines = [f"identity: {who}", f"namespaces: {' '.join(policy.namespaces)}"]
    for m in policy.mounts:
        if m.kind == "dir":
            continue
        src = f" <- {m.source}" if m.source and m.source != m.dest else ""
        size = f" ({m.size >> 20} MiB)" if m.size else ""
        lines.append(f"mount {m.kind}{'?' if m.optional else ''} {m.dest}{src}{size}")
    lines += [f"rlimit {k}: soft {s} hard {h}" for k, (s, h) in policy.rlimits.items()]
    lines += [f"cgroup {k}: {v}" for k, v in policy.cgroup.items()]
    lines.append(f"disk: the job's writable folders hold at most {policy.disk_bytes >> 20} MiB (watched; killed past it)")
    lines += [f"seccomp {k}: {', '.join(v) if isinstance(v, list) else v}" for k, v in policy.seccomp.items()]
    lines.append(f"environment (cleared, then): {' '.join(policy.environment)}")
    return lines + list(policy.notes)


def etc_files(identity: Identity) -> dict[str, str]:
    """passwd, group and hosts for the jail: its own user and group, nobody else's."""
    uid, gid = identity.inside_uid, identity.inside_uid if identity.mode == "userns" else identity.gid
    return {
        "/etc/passwd": f"root:x:0:0::/nonexistent:/usr/sbin/nologin\njail:x:{uid}:{gid}::{JAIL_HOME}:/usr/sbin/nologin\n",
        "/etc/group": f"root:x:0:\njail:x:{gid}:\n",
        "/etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
    }


def present(mounts: list[Mount]) -> list[Mount]:
    """Optional mounts of things this host has."""
    return [m for m in mounts if not m.optional or os.path.exists(m.source)]
