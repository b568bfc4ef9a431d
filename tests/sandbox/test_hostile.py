"""Hostile candidates (tests/fixtures/hostile) through the whole `appliance eval`: real bubblewrap jail, seccomp,
cgroups, Triton's interpreter on the CPU.

Each test checks three things: the verdict and a reason that says what happened; that the damage did not happen,
looked at from outside the jail; and that the worker survives. An honest candidate passes again at the end of the
module, and right after the attack in the tests whose damage would outlast the evaluation unseen: the host's disk,
the jail uid's process count (RLIMIT_NPROC), the CPU-time limit. (The others assert the damage did not happen, no
process left and nothing received, and an honest evaluation each cost the suite about 8 CPU-seconds.)
Fixtures that need host values (a port, a path, a marker) carry "__KEY__" string literals that `hostile()` fills in.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

import sandbox
from tests.conftest import FIXTURES, REPO, candidate

HOSTILE = FIXTURES / "hostile"


def hostile(name: str, tmp_path: Path, **values) -> Path:
    """The hostile candidate `name`, written to tmp_path with each "__KEY__" literal replaced by repr(value)."""
    source = (HOSTILE / f"{name}.py").read_text()
    for key, value in values.items():
        literal = f'"__{key.upper()}__"'
        assert literal in source, f"{name}.py has no {literal} to fill in"
        source = source.replace(literal, repr(value))
    assert '"__' not in source.replace('"__main__"', ""), f"{name}.py has a placeholder the test did not fill"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def processes_with(marker: str) -> list[str]:
    """Host processes (other than this one) whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        if marker in cmdline:
            found.append(f"pid {entry.name}: {cmdline[:200]}")
    return found


def stored(appliance, evaluation_id: int) -> str:
    """`appliance show ID --json`: the evaluation as the database holds it."""
    shown = appliance("show", evaluation_id, "--json")
    assert shown.exit_code == 0, shown.output
    return shown.stdout


def honest_still_passes(appliance, task: Path) -> None:
    code, result = appliance.eval_json(task, candidate("good"))
    assert (code, result["verdict"]) == (0, "pass"), result["reason"]


def unique_digits() -> str:
    return str(secrets.randbelow(9 * 10**8) + 10**8)


# --- network ---------------------------------------------------------------------------------------------------------


class Listener:
    """TCP and UDP on 127.0.0.1 (same port), outside the jail; records anything that arrives."""

    def __init__(self):
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.tcp.settimeout(0.2)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.udp.settimeout(0.2)
        self.received: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True),
                        threading.Thread(target=self._datagrams, daemon=True)]
        for t in self.threads:
            t.start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, peer = self.tcp.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
            self.received.append(f"tcp from {peer}: {data!r}")

    def _datagrams(self):
        while not self.stop.is_set():
            try:
                data, peer = self.udp.recvfrom(4096)
            except OSError:
                continue
            self.received.append(f"udp from {peer}: {data!r}")

    def close(self) -> list[str]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        self.tcp.close(), self.udp.close()
        return self.received


def test_network_is_refused_and_nothing_reaches_the_host(appliance, softmax_task, tmp_path):
    listener = Listener()
    try:
        code, result = appliance.eval_json(softmax_task, hostile("network", tmp_path, port=listener.port))
    finally:
        received = listener.close()
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("sandbox_violation", "correctness"), result["reason"]
    reason = result["reason"]
    assert "the jail refused an operation" in reason, reason
    for attempt in ("'tcp4': 'EPERM'", "'tcp6': 'EPERM'", "'udp4': 'EPERM'", "'netlink': 'EPERM'"):
        assert attempt in reason, reason
    assert received == []


# --- secrets and files outside the job --------------------------------------------------------------------------------


def test_planted_secrets_stay_out_of_reach_and_out_of_the_record(appliance, softmax_task, home, tmp_path):
    token = f"tok-{secrets.token_hex(16)}"
    secret = tmp_path / "secret.txt"
    secret.write_text(f"api_key={token}\n")
    # An honest evaluation first, whose candidate source carries the token: now the database holds it.
    carrier = tmp_path / "good_with_token.py"
    carrier.write_text(candidate("good").read_text() + f"\n# {token}\n")
    code, result = appliance.eval_json(softmax_task, carrier)
    assert code == 0, result["reason"]
    db = home / "appliance.db"
    assert any(token.encode() in f.read_bytes() for f in home.glob("appliance.db*"))  # the file or its WAL

    code, result = appliance.eval_json(softmax_task, hostile("planted_secret", tmp_path, secret_path=str(secret),
                                                             db_path=str(db)))
    assert token not in json.dumps(result)
    assert token not in stored(appliance, result["evaluation_id"])
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("runtime_error", "correctness"), result["reason"]
    reason = result["reason"]
    assert "nothing leaked" in reason, reason
    # None of them exists inside the jail: not refused, simply not there.
    for name in ("secret", "db", "db-wal"):
        assert f"'{name}': 'FileNotFoundError" in reason, reason
    assert secret.read_text() == f"api_key={token}\n"


def test_worker_environment_stays_out_of_reach(appliance, softmax_task, monkeypatch):
    token = f"tok-{secrets.token_hex(16)}"
    monkeypatch.setenv("APPLIANCE_PLANTED_SECRET", token)
    code, result = appliance.eval_json(softmax_task, HOSTILE / "reads_worker_environment.py")
    assert token not in stored(appliance, result["evaluation_id"]), result["reason"][:300]
    assert token not in json.dumps(result)
    assert (result["verdict"], result["stage"]) == ("runtime_error", "correctness"), result["reason"]
    assert "nothing leaked" in result["reason"], result["reason"]


def write_targets(tmp_path: Path, home: Path, token: str) -> list[str]:
    """Host paths a hostile candidate must not be able to create: persistence points and shared directories."""
    return [
        f"/var/tmp/pwned-{token}",
        f"/tmp/../var/tmp/pwned2-{token}",
        f"/etc/pwned-{token}",
        f"/root/pwned-{token}",
        f"/tmp/pwned-{token}",
        f"/dev/shm/pwned-{token}",
        str(Path(sysconfig.get_paths()["purelib"]) / f"pwned-{token}.pth"),  # run by every later Python start
        str(Path(sandbox.__file__).resolve().parent / f"pwned_{token}.py"),  # the harness package
        str(REPO / f"pwned-{token}"),
        str(tmp_path / f"pwned-{token}"),
        str(home / f"pwned-{token}"),
        str(home / "jobs" / f"pwned-{token}"),  # beside the job's own directory
    ]


def test_writes_outside_the_job_leave_nothing_on_the_host(appliance, softmax_task, home, tmp_path):
    token = secrets.token_hex(8)
    targets = write_targets(tmp_path, home, token)
    code, result = appliance.eval_json(softmax_task, hostile("writes_outside", tmp_path, targets=targets))
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("sandbox_violation", "correctness"), result["reason"]
    reason = result["reason"]
    assert "the jail refused an operation" in reason and "write attempts" in reason, reason
    # The jail's root is its own (a read-only system, an /etc of a few files, no /var): the first write refused is
    # the first target's, whether as a missing folder the jail uid may not make or a read-only file system.
    assert re.search(r"first refused: /var(/tmp)?: (Permission denied|Read-only file system)", reason), reason
    # What each attempt got, as the candidate saw it: the persistence points were refused, not just hidden.
    attempts = json.loads(stored(appliance, result["evaluation_id"]))["details"]["candidate_stderr"]
    for persistent in targets[6:8]:
        assert f"'{persistent}': 'EROFS'" in attempts, attempts
    created = [t for t in targets if os.path.lexists(t)]
    assert created == []
    assert list((home / "jobs").iterdir()) == []  # the job directory itself is gone too


def test_a_tree_too_deep_for_rmtree_costs_the_candidate_its_verdict_not_the_run(appliance, softmax_task, home, tmp_path):
    code, result = appliance.eval_json(softmax_task, hostile("deep_tree", tmp_path))
    # Past PATH_MAX, the disk watcher cannot measure the tree, which counts as past the cap (disk_limit); a
    # candidate quicker than the watcher's look fails with its own error. Either way a verdict, and the run goes on.
    assert code == 1 and result["verdict"] in ("runtime_error", "disk_limit"), result
    assert "left a deep tree behind" in result["reason"] or "disk cap" in result["reason"], result["reason"]
    assert list((home / "jobs").iterdir()) == []  # removed all the same


# --- processes --------------------------------------------------------------------------------------------------------


def test_fork_bomb_hits_the_process_limit_and_leaves_no_process(appliance, softmax_task, tmp_path):
    marker = f"86400.{unique_digits()}"  # what every child sleeps for: a valid argument, unique to this run
    code, result = appliance.eval_json(softmax_task, hostile("fork_bomb", tmp_path, marker=marker),
                                       "--pids-limit", "64")
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("process_limit", "correctness"), result["reason"]
    assert "limit of 64 processes/threads" in result["reason"] and "forks refused" in result["reason"]
    assert processes_with(marker) == []


def test_memory_bomb_hits_the_memory_limit(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, HOSTILE / "memory_bomb.py", "--memory-limit", "1.5")
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("memory_limit", "correctness"), result["reason"]
    assert "memory limit of 1.5 GiB" in result["reason"] and "killed" in result["reason"]


# The wall-clock limit counts from the jailed process's start. On a loaded 2-core CI host its imports and the
# candidate's load took over 10 s once (the verdict then came at "load", before the hostile forward ever ran), so
# the test gives it 20 s: long enough to reach the forward, short enough to prove the kill. (The candidate spins on one
# core, as the old spin.py did on two: the wall clock is what stops a spinner, its CPU-time limit being cores x the
# timeout; burns_cpu.py's tests cover that limit.)
HOSTILE_TIMEOUT_S = 20


def test_setsid_grandchildren_do_not_outlive_the_evaluation(appliance, softmax_task, tmp_path):
    digits = unique_digits()
    path = hostile("setsid_grandchild", tmp_path, sleep_for=f"31337.{digits}", marker=f"hostile-31337.{digits}")
    code, result = appliance.eval_json(softmax_task, path)
    # Starting helpers is not itself a violation: the answer is right, and the jail ends them all.
    assert (code, result["verdict"]) == (0, "pass"), result["reason"]
    assert processes_with(f"31337.{digits}") == []


def test_ignored_sigterm_does_not_outlast_the_timeout(appliance, softmax_task, tmp_path):
    marker = f"hostile-stubborn-{unique_digits()}"
    code, result = appliance.eval_json(softmax_task, hostile("ignores_sigterm", tmp_path, marker=marker),
                                       "--timeout", str(HOSTILE_TIMEOUT_S))
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("timeout", "correctness"), result["reason"]
    assert f"did not finish within {HOSTILE_TIMEOUT_S} s" in result["reason"] and "killed" in result["reason"]
    # killed at the limit, not whenever it pleased
    assert HOSTILE_TIMEOUT_S <= result["wall_s"]["candidate"] < HOSTILE_TIMEOUT_S + 10
    assert processes_with(marker) == []


# --- verdicts from the harness and the kernel -------------------------------------------------------------------------

# name -> (verdict, stage, words the reason must contain)
KILLED_OR_REJECTED = {
    "ptrace": ("sandbox_violation", "correctness", ["seccomp", "SIGSYS", "forbidden system call"]),
    "segfault": ("crashed", "correctness", ["killed by signal SIGSEGV"]),
    "fake_result_lines": ("wrong_output", "correctness", ["max abs err", "> tol", "seed 0"]),
}


@pytest.mark.parametrize("name", sorted(KILLED_OR_REJECTED))
def test_hostile_candidate_gets_specific_verdict(appliance, softmax_task, name):
    verdict, stage, words = KILLED_OR_REJECTED[name]
    code, result = appliance.eval_json(softmax_task, HOSTILE / f"{name}.py")
    assert code == 1, result
    assert (result["verdict"], result["stage"]) == (verdict, stage), result["reason"]
    for word in words:
        assert word in result["reason"], result["reason"]
    assert result["timings"] == [] and result["speedup_vs_eager"] is None
    assert json.loads(stored(appliance, result["evaluation_id"]))["verdict"] == verdict


# --- state across jobs, output ----------------------------------------------------------------------------------------


def test_nothing_carries_over_from_one_job_to_the_next(appliance, softmax_task, home, tmp_path):
    token = secrets.token_hex(8)
    path = hostile("cache_across_jobs", tmp_path, token=token)
    for attempt in ("first", "second"):
        code, result = appliance.eval_json(softmax_task, path)
        # The second run raises "FOUND CACHE at ..." if anything the first one wrote is still visible.
        assert (code, result["verdict"]) == (0, "pass"), f"{attempt} run: {result['reason']}"
    name = f"hostile-softmax-cache-{token}"
    left = [p for p in (Path("/tmp") / name, Path("/dev/shm") / name, Path("/var/tmp") / name, Path.home() / name,
                        Path.home() / ".cache" / name, Path.home() / ".triton/cache" / name) if p.exists()]
    left += [str(p) for p in tmp_path.rglob(name)]
    assert left == []
    assert list((home / "jobs").iterdir()) == []


def test_output_flood_is_survived_and_stored_capped(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, HOSTILE / "output_flood.py")
    assert (code, result["verdict"]) == (0, "pass"), result["reason"]
    shown = stored(appliance, result["evaluation_id"])
    details = json.loads(shown)["details"]
    assert details["jail"]["output_bytes"] >= 56 << 20  # all of it was read (and counted) ...
    assert shown.count("FLOOD") * 64 <= 64 << 10  # ... but at most 64 KiB of it kept
    assert len(shown) < 128 << 10


# --- result files: the old harness read one from the candidate's folder; nothing there is read now -----------------


def test_forged_result_file_does_not_pass(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, HOSTILE / "forged_result.py")
    assert result["verdict"] != "pass" and code == 1, result


def test_malformed_result_file_is_a_verdict_not_a_controller_crash(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, HOSTILE / "malformed_result.py")
    assert code == 1 and result["verdict"] in ("crashed", "runtime_error", "sandbox_violation"), result


def test_fifo_result_file_does_not_hang_the_worker(home, softmax_task):
    # Run as a subprocess: a hang must fail the test, not the whole session.
    cmd = [sys.executable, "-m", "appliance", "eval", str(softmax_task), str(HOSTILE / "fifo_result.py"), "--json",
           "--device", "cpu", "--baselines", "eager", "--timing-budget", "0.05"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO,
                              env=os.environ | {"APPLIANCE_HOME": str(home)})
    except subprocess.TimeoutExpired:
        raise AssertionError("appliance eval still running 30 s after starting: the worker hangs") from None
    result = json.loads(done.stdout)
    assert done.returncode == 1 and result["verdict"] in ("crashed", "sandbox_violation", "runtime_error"), result


def test_symlinked_result_file_is_not_read_on_the_host(appliance, softmax_task, tmp_path):
    token = f"tok-{secrets.token_hex(16)}"
    host_file = tmp_path / "host.json"  # invisible inside the jail: only the host can resolve the link
    host_file.write_text(json.dumps({"status": "failed", "verdict": "runtime_error", "stage": "load",
                                     "reason": f"read on the host: {token}"}))
    code, result = appliance.eval_json(softmax_task, hostile("symlink_result", tmp_path, target=str(host_file)))
    assert token not in json.dumps(result), result["reason"]
    assert code == 1 and result["verdict"] in ("crashed", "sandbox_violation", "runtime_error"), result


# --- the host's files and every limit (issue 23) ----------------------------------------------------------------------


@pytest.fixture
def appliance_env_file():
    """/etc/appliance/appliance.env with a secret in it, as the shipped units have it (made here when absent)."""
    path = Path("/etc/appliance/appliance.env")
    if path.exists() or os.geteuid() != 0:
        yield path
        return
    secret = f"APPLIANCE_DB_URL=postgresql://appliance:{secrets.token_hex(8)}@127.0.0.1/appliance\n"
    path.parent.mkdir(exist_ok=True)
    path.write_text(secret)
    path.chmod(0o640)
    try:
        yield path
    finally:
        path.unlink()
        path.parent.rmdir()


HOST_TARGETS = [("/proc/sys/kernel/core_pattern", True), ("/proc/sysrq-trigger", True), ("/proc/sys/vm/drop_caches", True),
                ("/etc/shadow", False), ("/etc/gshadow", False), ("/etc/appliance/appliance.env", False),
                ("home:appliance.db", False), ("/root/.ssh", False), ("/sys/fs/cgroup", False)]


def test_host_files_are_neither_writable_nor_readable_from_the_jail(appliance, softmax_task, home, tmp_path,
                                                                     appliance_env_file):
    """As root (CI) too: the jail is never host root, /proc/sys is read-only to it, /etc is an allowlist, and the
    appliance's home (its database) is not mounted. One candidate tries them all (one evaluation, not nine); it
    passes if any open succeeds."""
    targets = [(str(home / t.split(":", 1)[1]) if t.startswith("home:") else t, write) for t, write in HOST_TARGETS]
    appliance("runs")  # makes the database file, so that there is one to reach for
    code, result = appliance.eval_json(softmax_task, hostile("host_access", tmp_path, targets=targets))
    assert code == 1
    # Refused (the jail refused an operation), or not there at all (a plain runtime error naming the missing file).
    assert (result["verdict"], result["stage"]) in {("sandbox_violation", "correctness"),
                                                     ("runtime_error", "correctness")}, result["reason"]
    for target, _ in targets:
        assert re.search(re.escape(target) + r": (Permission denied|No such file or directory|Read-only file system)",
                         result["reason"]), (target, result["reason"])


def test_disk_filler_is_killed_at_its_cap_and_the_host_keeps_its_space(appliance, softmax_task, home, tmp_path):
    cap = 256 << 20
    jobs = home / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    before = shutil.disk_usage(jobs).free
    lowest, done = [before], threading.Event()

    def watch():
        while not done.wait(0.02):
            lowest.append(shutil.disk_usage(jobs).free)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        code, result = appliance.eval_json(softmax_task, HOSTILE / "fills_disk.py", "--disk-limit", "0.25")
    finally:
        done.set()
        watcher.join()
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("disk_limit", "correctness"), result["reason"]
    assert "disk cap of 0.25 GiB" in result["reason"] or "File too large" in result["reason"], result["reason"]
    # The cap is watched (every 0.1 s), so a fast writer may pass it by what it writes in that time; never by more.
    assert before - min(lowest) < cap + (256 << 20), (before - min(lowest)) >> 20
    assert list(jobs.iterdir()) == []


@pytest.mark.parametrize("ignore", [False, True])
def test_cpu_burner_is_stopped_by_the_cpu_limit_and_named(appliance, softmax_task, tmp_path, ignore):
    """The soft limit's SIGXCPU names the limit; a candidate that ignores it is SIGKILLed at the hard limit, and the
    CPU seconds its tree used say why."""
    code, result = appliance.eval_json(softmax_task, hostile("burns_cpu", tmp_path, ignore=ignore),
                                       "--cpu-limit", "8", "--timeout", "120")
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("cpu_limit", "correctness"), result["reason"]
    assert "CPU-time limit of 8 s" in result["reason"]
    assert result["wall_s"]["candidate"] < 60  # the CPU limit stopped it, not the wall clock


def test_fork_bomb_without_a_pids_controller_is_stopped_by_rlimit_nproc(appliance, softmax_task, tmp_path,
                                                                      monkeypatch):
    """As on the H200 host (cgroup v2 with only memory delegated): RLIMIT_NPROC per jail uid, and the verdict is
    still process_limit."""
    from sandbox import cgroup

    parents = cgroup._parents
    monkeypatch.setattr(cgroup, "_parents", lambda: (lambda v, p: (v, {"memory": p["memory"]}))(*parents()))
    marker = f"86400.{unique_digits()}"
    code, result = appliance.eval_json(softmax_task, hostile("fork_bomb", tmp_path, marker=marker),
                                       "--pids-limit", "64")
    assert code == 1
    assert (result["verdict"], result["stage"]) == ("process_limit", "correctness"), result["reason"]
    assert "RLIMIT_NPROC" in result["reason"]
    assert processes_with(marker) == []


def test_without_a_memory_limit_nothing_runs_unless_the_operator_opts_out(appliance, softmax_task, monkeypatch):
    from sandbox import cgroup

    def unavailable():
        raise cgroup.CgroupUnavailable("no writable memory cgroup controller (test)")

    monkeypatch.setattr(cgroup, "_parents", unavailable)
    refused = appliance("eval", softmax_task, candidate("good"), "--json", "--device", "cpu", "--baselines", "eager")
    assert refused.exit_code != 0
    assert "no memory limit can be enforced" in refused.output and "APPLIANCE_UNSAFE_NO_MEMORY_LIMIT" in refused.output
    doctor = json.loads(appliance("doctor", "--json").stdout)
    check = {c["name"]: c for c in doctor["checks"]}["memory limit"]
    assert not check["ok"] and check["required"] and "no candidate runs" in check["detail"]

    monkeypatch.setenv("APPLIANCE_UNSAFE_NO_MEMORY_LIMIT", "1")
    code, result = appliance.eval_json(softmax_task, candidate("good"))
    assert (code, result["verdict"], result["memory_limited"]) == (0, "pass", False), result["reason"]
    assert json.loads(stored(appliance, result["evaluation_id"]))["memory_limited"] is False


def test_a_reference_past_the_disk_cap_is_the_tasks_error_naming_the_setting(appliance, softmax_task):
    result = appliance("eval", softmax_task, candidate("good"), "--json", "--device", "cpu", "--baselines", "eager",
                       "--disk-limit", "0.00001")  # 10 KiB: less than its inputs
    assert result.exit_code != 0
    assert "needs more than the jail's" in result.output and "APPLIANCE_JAIL_DISK_GIB" in result.output, result.output


def test_a_result_record_nested_too_deep_is_a_verdict_not_a_controller_crash(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, HOSTILE / "result_json_bomb.py")
    # No record of the candidate's is read any more (the referee writes the record); whatever it writes, it fails.
    assert code == 1 and result["verdict"] in ("crashed", "tampering", "runtime_error"), result


# --- and after all of them (last in the file: pytest runs a module's tests in order, on one worker) --------------------


def test_honest_candidate_still_passes_after_the_hostile_ones(appliance, softmax_task):
    """One honest evaluation after every hostile one above (the disk filler, the CPU burner, the fork bomb among
    them), on the same worker and home: none left the jail, the disk or the process table unfit for the next
    (once, not after each: three evaluations fewer in CI)."""
    honest_still_passes(appliance, softmax_task)
