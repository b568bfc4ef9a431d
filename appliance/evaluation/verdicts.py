"""Verdicts from what the trusted side saw: the referee's record, the kernel server's jail, and the checks made on a
record that passed the referee (an ordered list: the first that fires names the verdict).

Nothing here reads anything the candidate's process wrote, but for its self-reported failure (which only fails it)
and the provenance record (a policy check on honest output)."""

from __future__ import annotations

import re
import signal
from typing import NamedTuple

from sandbox.jail import JailResult


class Rejection(NamedTuple):
    """A candidate's verdict, the stage it reached, the specific reason, and the check that made it (stored with
    the outcome as details["rejected_by"], so a verdict always says which check fired)."""

    verdict: str
    stage: str
    reason: str
    check: str


def verdict_of(referee: dict, run: JailResult, timeout: float) -> Rejection | None:
    """The rejection of a candidate from the referee's record and the server's jail, or None for a pass.
    A limit that bit explains the server's end; otherwise the referee's verdict stands."""
    status = referee.get("status")
    if status == "ok":
        return None
    stage = str(referee.get("stage") or "load")
    if status == "rejected":
        untrusted = referee.get("untrusted") or {}
        limited = _candidate_failure(run, {"status": "failed", "stage": stage, "reason": referee.get("reason", ""),
                                           "traceback": untrusted.get("traceback", "")}, timeout, limits_only=True)
        return limited or Rejection(str(referee["verdict"]), stage, str(referee.get("reason", ""))[:6000], "referee")
    # The server went away: its jail says why.
    return _candidate_failure(run, {"status": "running", "stage": stage}, timeout) or Rejection(
        "crashed", stage, f"the kernel server stopped answering: {str(referee.get('reason'))[:300]}", "jail")


def _candidate_failure(run: JailResult, result: dict | None, timeout: float,
                       limits_only: bool = False) -> Rejection | None:
    said = _jail_says(run, result, timeout, limits_only)
    return Rejection(*said, "jail") if said else None


def _jail_says(run: JailResult, result: dict | None, timeout: float,
               limits_only: bool = False) -> tuple[str, str, str] | None:
    """What the server's jail says of its end: a limit that bit, a timeout, a signal; with `limits_only`, only a
    limit (a verdict the referee made from what the server said may be a limit's effect: a MemoryError, a failed
    fork)."""
    stage = result.get("stage", "load") if result else "load"
    events, limits = run.limit_events, run.limits
    # A limit that bit explains whatever came after it (a MemoryError, a failed fork, a killed process).
    if events.get("oom_kill"):
        return "memory_limit", stage, (f"the candidate exceeded its memory limit of "
                                       f"{limits.get('memory_bytes', 0) / 2**30:.3g} GiB and was killed")
    if events.get("pids_max") and (run.returncode != 0 or (result or {}).get("status") != "ok"):
        return "process_limit", stage, (f"the candidate hit its limit of {limits.get('pids_max')} processes/threads "
                                        f"({events['pids_max']} forks refused)")
    if "disk_limit" in events:
        return "disk_limit", stage, (f"the candidate's folders grew past their disk cap of "
                                     f"{limits.get('disk_bytes', 0) / 2**30:.3g} GiB "
                                     f"({events['disk_limit'] / 2**30:.3g} GiB seen) and it was killed")
    if run.timed_out:
        return "timeout", stage, f"the candidate did not finish within {timeout:.0f} s (wall clock); killed"
    if run.signal == signal.SIGSYS:
        return "sandbox_violation", stage, ("the candidate made a forbidden system call and was killed by the "
                                            "jail's seccomp filter (SIGSYS)")
    cpu_limit = limits.get("cpu_seconds")
    if run.signal == signal.SIGXCPU or (run.signal == signal.SIGKILL and cpu_limit and run.cpu_s is not None
                                        and run.cpu_s >= cpu_limit):
        return "cpu_limit", stage, (f"the candidate used up its CPU-time limit of {cpu_limit} s "
                                    f"({run.cpu_s or cpu_limit:.0f} s used) and was killed")
    if run.signal == signal.SIGXFSZ:
        return "disk_limit", stage, f"the candidate wrote a file larger than {limits.get('file_bytes', 0) >> 20} MiB"
    said = " ".join(str((result or {}).get(k, "")) for k in ("reason", "traceback")) + run.stderr[-4000:]
    failed = run.returncode != 0 or (result or {}).get("status") != "ok"
    # Without a pids controller, the process limit is RLIMIT_NPROC: the kernel counts nothing we can read, but the
    # candidate's own failure says it (believed only to fail it: a candidate can always fail itself).
    if failed and limits.get("processes") == "RLIMIT_NPROC" and _NPROC_WORDS.search(said):
        return "process_limit", stage, (f"the candidate hit its limit of {limits.get('pids_max')} processes/threads "
                                        "(RLIMIT_NPROC: a fork or thread was refused)")
    if failed and ("No space left on device" in said or "File too large" in said):
        return "disk_limit", stage, ("the candidate filled the space it may write (its folders, or the jail's "
                                     f"private /tmp of {limits.get('scratch_bytes', 0) >> 20 or 'capped'} MiB): "
                                     "No space left on device")
    if limits_only:
        return None
    if result is None or result.get("status") == "running" or run.returncode != 0:
        if run.signal:
            how = f"was killed by signal {_signal_name(run.signal)}"
        else:
            how = f"exited with code {run.returncode} before reporting a result"
        tail = run.stderr.strip().splitlines()[-1:] or [""]
        return "crashed", stage, f"the candidate process {how}; last stderr line: {tail[0][:300]}"
    return None


_NPROC_WORDS = re.compile(r"BlockingIOError|Resource temporarily unavailable|can't start new thread|EAGAIN")


def host_out_of_memory(run: JailResult, failure: Rejection) -> str | None:
    """Why a candidate's crash is the host's doing: killed by SIGKILL, which no limit of ours sent (a cgroup's
    OOM kill is `memory_limit`, a timeout `timeout`), while the kernel's OOM killer fired on a host whose jobs run
    without cgroups: the host ran short of memory (everything in flight allocates), and the candidate was its
    victim. Queued again, not blamed; a
    candidate that exhausts the host's memory itself fails again on its second try and is then recorded as an
    infrastructure failure, never a pass (where cgroups apply, its own limit stops it first)."""
    kills = run.limit_events.get("host_oom_kills")
    # Only where no cgroup bounded the jobs: the kernel's count includes cgroup OOM kills, so beside cgroups a
    # neighbour's `memory_limit` would excuse a candidate that killed itself.
    caged = not str(run.limits.get("cgroup", "unavailable")).startswith("unavailable")
    if failure[0] != "crashed" or run.signal != signal.SIGKILL or not kills or caged:
        return None
    return (f"the candidate was killed by SIGKILL at {failure[1]} while the host's OOM killer fired ({kills} kill(s) "
            "during its run): the host ran out of memory, which is not the candidate's failure")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


# Library GEMMs and convolutions beside a kernel of the candidate's own are the usual way to fuse an epilogue (a
# matmul's bias, activation, norm): allowed, unless they are all the reference does (the subset rule below).
LIBRARY_GEMMS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution",
                           "cudnn_convolution", "_scaled_mm", "addmv", "mv"})


def library_fallback(provenance: dict | None, reference_ops: list[str], timings: dict | None = None) -> str | None:
    """A finding, not a speedup: a call with no kernel of the candidate's own, or library compute ops beside it (the
    reference's own, or composed ones such as amax, exp, sum, div); allocation, views, copies and library GEMMs
    feeding a fused kernel are fine. A policy check on honest output: the kernel server reports it, and can lie
    (correctness and time are the security boundary)."""
    from sandbox.harness.provenance import compute_ops

    if not isinstance(provenance, dict) or not isinstance(provenance.get("ops"), list):
        return "the kernel server reported no record of what forward ran"
    used = compute_ops(provenance["ops"])
    if not provenance.get("own_launches"):
        library = f" (it only called library ops: {', '.join(sorted(used))})" if used else ""
        return f"forward launched no kernel of its own (Triton, load_inline or CuPy){library}"
    ref = compute_ops(reference_ops)
    if ref and ref <= used:
        return (f"forward calls the reference's own library ops ({', '.join(sorted(ref))}) beside its kernel: "
                "a library fallback, not a speedup")
    if composed := used - LIBRARY_GEMMS:
        return (f"forward calls library compute ops ({', '.join(sorted(composed))}) beside its kernel: composed "
                "library ops are a library fallback, not a speedup (allocation, views and copies are fine)")
    for shape, t in (timings or {}).items():
        if isinstance(t, dict) and (t.get("launches_per_call_min") or 0) < 1:
            return (f"timed calls at shape {shape} launched fewer kernels of their own than there were calls: a "
                    "library fallback where no correctness call looked")
    return None
