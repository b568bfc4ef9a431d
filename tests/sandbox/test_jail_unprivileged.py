"""The jail run by an unprivileged worker (as the shipped systemd units run it: User=appliance, Delegate=yes), on
this root CI host: a child process is given a cgroup of its own (what systemd's delegation does), switches to an
unprivileged uid, and runs the jail from there with the system's Python (the venv's lives under /root, which the
unprivileged user cannot read). The jail is then uid 65534 in a user namespace mapped to that uid.

Each hostile probe runs in that jail and must get its named limit or a refusal; then an honest one still runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO

SYSTEM_PYTHON = Path("/usr/bin/python3")
WORKER_UID = 1_999_990_000  # no such user on the host: an unprivileged worker with nothing of its own

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON.exists() or not shutil.which("bwrap"),
                                reason="needs root (to become an unprivileged worker), /usr/bin/python3 and bwrap")

DRIVER = r"""
import json, sys
from pathlib import Path
from sandbox.jail import Jail

work = Path(sys.argv[1])
PROBES = {
    "identity": ("import json, os; st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines()"
                 " if ':' in l); print(json.dumps({'uid': os.getuid(), 'capeff': st['CapEff'].strip(),"
                 " 'made': open('made-here', 'w').name}))", {}),
    "core_pattern": ("import os; os.open('/proc/sys/kernel/core_pattern', os.O_WRONLY)", {}),
    "shadow": ("open('/etc/shadow').read()", {}),
    "memory": ("chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))", {"memory_bytes": 256 << 20}),
    "forks": ("import os, time\nfor _ in range(200):\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n"
              "    except BlockingIOError:\n        raise SystemExit(7)", {"pids_max": 40}),
    "cpu": ("while True: pass", {"cpu_seconds": 2}),
    "disk": ("import os\nfor i in range(100):\n    open(f'fill-{i}', 'wb').write(b'x' * (8 << 20))",
             {"disk_bytes": 64 << 20}),
    "honest": ("print(sum(range(10)))", {}),
}
out = {}
for name, (code, options) in PROBES.items():
    r = Jail(**options).run([sys.executable, "-c", code], workdir=work / name, timeout_s=60)
    out[name] = {"rc": r.returncode, "signal": r.signal, "stdout": r.stdout, "stderr": r.stderr[-300:],
                 "events": r.limit_events, "limits": r.limits}
    if name == "identity":  # who the jail's uid is on the host: the owner of a file it made in its folder
        out[name]["host_owner"] = (work / name / "made-here").stat().st_uid
print(json.dumps(out))
"""


def delegated_cgroup(uid: int) -> list[Path]:
    """A memory (+pids) cgroup owned by `uid`, as systemd's Delegate=yes gives the worker's unit."""
    from sandbox.cgroup import ROOT

    made = []
    name = f"appliance-test-worker-{uuid.uuid4().hex[:8]}"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for ctrl in ctrls.split(","):
            if ctrl in ("memory", "pids", "cpuacct") and (ROOT / ctrl).is_dir():
                d = ROOT / ctrl / path.lstrip("/") / name
                d.mkdir()
                for entry in [d, *d.iterdir()]:
                    os.chown(entry, uid, uid)
                made.append(d)
    if not made:  # cgroup v2: one directory; the child moves itself into a leaf (sandbox/cgroup.py)
        own = Path("/proc/self/cgroup").read_text().splitlines()[0].split(":", 2)[2]
        d = ROOT / own.lstrip("/") / name
        d.mkdir()
        for entry in [d, *d.iterdir()]:
            os.chown(entry, uid, uid)
        made.append(d)
    return made


def test_unprivileged_worker_jail_is_userns_mapped_and_every_limit_binds():
    import pyseccomp

    site = str(Path(pyseccomp.__file__).parent)
    work = Path(tempfile.mkdtemp(prefix="appliance-unprivileged-"))
    os.chown(work, WORKER_UID, WORKER_UID)
    cgroups = delegated_cgroup(WORKER_UID)

    def become_worker():
        for d in cgroups:
            (d / "cgroup.procs").write_text(str(os.getpid()))
        os.setgroups([])
        os.setresgid(WORKER_UID, WORKER_UID, WORKER_UID)
        os.setresuid(WORKER_UID, WORKER_UID, WORKER_UID)

    try:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "PYTHONPATH": f"{REPO}:{site}"}
        done = subprocess.run([str(SYSTEM_PYTHON), "-c", DRIVER, str(work)], env=env, cwd=work, capture_output=True,
                              text=True, timeout=300, preexec_fn=become_worker)
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for d in cgroups:
            for child in d.iterdir():
                if child.is_dir():
                    child.rmdir()
            d.rmdir()

    identity = json.loads(seen["identity"]["stdout"])
    assert identity["uid"] == 65534 and identity["capeff"] == "0000000000000000"
    assert seen["identity"]["host_owner"] == WORKER_UID  # never host root: the worker's own uid
    assert seen["identity"]["limits"]["cgroup"] in ("v1", "v2")
    assert seen["core_pattern"]["rc"] != 0 and "Permission denied" in seen["core_pattern"]["stderr"]
    assert seen["shadow"]["rc"] != 0 and "No such file" in seen["shadow"]["stderr"]
    assert seen["memory"]["events"]["oom_kill"] >= 1
    assert seen["forks"]["rc"] == 7
    assert seen["cpu"]["signal"] == 24  # SIGXCPU: the soft CPU limit, below the hard one
    assert "disk_limit" in seen["disk"]["events"]
    assert seen["honest"]["rc"] == 0 and seen["honest"]["stdout"].strip() == "45"
