#!/usr/bin/env python3
"""The optimisation loop on bundled tasks: what a tuner run finds, and how many evaluations per GPU-hour it does.

    python benchmarks/optimize_suite.py [--tasks softmax,rmsnorm,layernorm] [--max-candidates 12] [--device auto]
                                        [--gpus 0 | --executor HOST:PORT] [--max-wall S] [--compare-naive]
                                        [--naive-max N] [--in-flight N] [--out DIR] [--copy-dbs DIR]

For each task: `appliance optimize benchmarks/tasks/T.py --proposer tune --json` in a fresh APPLIANCE_HOME
(DIR/T-*), then the seed's and the best's stored timings (`appliance show ID --json`). One Markdown row per task,
printed as soon as the task is done (also appended to DIR/results.md). --compare-naive evaluates the same candidate
sources with benchmarks/naive_harness.py (KernelBench-style: one fresh process per candidate, main shape only)
and shows both throughputs: the naive harness once with its inputs drawn on the CPU and copied, as KernelBench's
eval does, and once drawn on the device (faster: it favours the baseline); --naive-inputs picks either. Evaluations per GPU-hour = evaluated / (wall hours x GPUs used), start-up included;
steady evaluations per hour: all GPUs together, over the middle half of the verdicts (see steady_rate). The naive
harness uses one GPU (the first of --gpus).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.naive_harness import run_candidates  # noqa: E402

COLUMNS = ["task", "evaluated", "seed ms -> best ms", "best vs eager", "best vs torch.compile", "best roofline %",
           "best's change", "wall s", "evals / GPU-h", "steady evals / h", "evals per GPU"]
NAIVE_COLUMNS = {"cpu": ["naive evals / GPU-h (inputs drawn on CPU)", "appliance / naive (CPU inputs)"],
                 "device": ["naive evals / GPU-h (inputs drawn on GPU)", "appliance / naive (GPU inputs)"]}


def appliance(home: Path, *args: str) -> dict:
    """Run the CLI as a user would; every command used here prints one JSON object on stdout's last line."""
    env = os.environ | {"APPLIANCE_HOME": str(home)}
    env.pop("APPLIANCE_DB_URL", None)  # the database must be the SQLite file under home (read below)
    proc = subprocess.run([sys.executable, "-m", "appliance", *args], cwd=REPO, env=env, capture_output=True,
                          text=True)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        sys.exit(f"appliance {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def main_timing(home: Path, evaluation_id: int | None) -> dict:
    """The candidate's timing row on the main shape (the one speedups are quoted for)."""
    if evaluation_id is None:
        return {}
    shown = appliance(home, "show", str(evaluation_id), "--json")
    return next((t for t in shown["timings"] if t["shape"] == "main" and t["implementation"] == "candidate"), {})


def steady_rate(verdicts: list[tuple[datetime, int | None]]) -> float | None:
    """Evaluations per hour (all GPUs together) over the middle half of the run's verdicts: from the one at the first
    quartile to the one at the third. It leaves out the start-up (inputs prepared, baselines timed, the seed evaluated
    alone, the slots filling) and the drain (no new evaluation once a budget is spent) alike, whatever the number of
    GPUs, so it shows how the rate scales with them. (Starting once every GPU had a first verdict favoured more GPUs:
    on one GPU that start is the seed's verdict, before the slots fill.) None with fewer than 8 verdicts."""
    times = sorted(t for t, _ in verdicts)
    if len(times) < 8:
        return None
    first, last = len(times) // 4, 3 * len(times) // 4
    seconds = (times[last] - times[first]).total_seconds()
    return (last - first) / (seconds / 3600) if seconds > 0 else None


def where_time_went(details: list[dict], host_busy: float | None) -> str:
    """Medians over a run's evaluations of what bounds the rate: each process's wall and CPU seconds, the device held
    exclusively, waiting for turns and for device memory (sandbox/gate.py), the most evaluations resident at once;
    and how busy the host's CPUs (those this suite may use) were over the run."""
    def median(values: list) -> str:
        values = sorted(v for v in values if isinstance(v, (int, float)))
        return f"{values[len(values) // 2]:.2f}" if values else "-"

    wall = [d.get("wall_s") or {} for d in details]
    cpu = [{k: (v or {}).get("cpu_s") for k, v in (d.get("stage_s") or {}).items()} for d in details]
    turns = [d.get("device_turns") or {} for d in details]
    most = max((t.get("neighbours", 0) for t in turns), default=0)
    return (f"median s per evaluation: referee and server {median([w.get('candidate') for w in wall])} "
            f"(referee CPU {median([c.get('referee') for c in cpu])}), device held "
            f"{median([t.get('held_s') for t in turns])}, "
            f"waited for turns {median([t.get('wait_s') for t in turns])}, for memory "
            f"{median([t.get('resident_wait_s') for t in turns])}, stopped while others measured "
            f"{median([t.get('paused_s') for t in turns])}; at most {most + 1} resident at once; host CPUs "
            f"{fmt(host_busy, '.0%')} busy over the run ({len(os.sched_getaffinity(0))} cores)"
            + device_states(details) + host_memory(details))


def host_memory(details: list[dict]) -> str:
    """The host-memory budget's side (appliance/evaluation/host_memory.py): what each evaluation held and waited,
    the harness processes' private memory at their peak (what PROCESS_BYTES must cover), and the host's OOM kills."""
    held = [d.get("host_memory") or {} for d in details]
    peaks = {p: sorted(v for d in details if isinstance(v := ((d.get("stage_s") or {}).get(p) or {})
                                                         .get("rss_anon_peak_gib"), (int, float)))
             for p in ("referee", "prepare")}
    waits = sorted(h["wait_s"] for h in held if isinstance(h.get("wait_s"), (int, float)))
    kills = sum(1 for d in details if ((d.get("jail") or {}).get("limit_events") or {}).get("host_oom_kills"))
    budget = next((h.get("budget_gib") for h in reversed(held) if h.get("budget_gib")), None)
    peak = ", ".join(f"{p} {v[len(v) // 2]:.2f} (max {v[-1]:.2f})" for p, v in peaks.items() if v) or "-"
    median = waits[len(waits) // 2] if waits else None
    return (f"; host memory: {fmt(held[0].get('held_gib') if held else None, '.1f')} GiB held per evaluation, "
            f"budget {fmt(budget, '.0f')} GiB (last), waited median {fmt(median, '.1f')} s, "
            f"max {fmt(waits[-1] if waits else None, '.1f')} s; private memory peak GiB: {peak}; "
            f"evaluations that saw a host OOM kill: {kills}; MemTotal now {fmt(mem_total_gib(), '.0f')} GiB")


def mem_total_gib() -> float | None:
    from appliance.evaluation.host_memory import mem_total_bytes

    total = mem_total_bytes()
    return None if total is None else total / 2**30


def start_up(started: datetime, rows: list[tuple[datetime, dict]], in_flight: int | None) -> str:
    """How long the run took to get going: seconds from its start to its first verdict and to as many verdicts as
    there are evaluations in flight per GPU (the first wave), and where the preparing of the task's inputs and
    baselines went (its stages, as the evaluation charged with it recorded them)."""
    times = sorted((t - started).total_seconds() for t, _ in rows)
    if not times:
        return "start-up: no verdict"
    prepare = next(((d.get("stage_s") or {}).get("prepare") for _, d in rows
                    if (d.get("stage_s") or {}).get("prepare")), None)
    stages = ", ".join(f"{k} {v:.1f}" for k, v in (prepare or {}).items()) or "-"
    wave = min(in_flight, len(times)) if in_flight else None  # without --in-flight: the CLI's default, not known here
    first_wave = f"verdict {wave} at {times[wave - 1]:.0f} s, " if wave else ""
    return (f"start-up: first verdict at {times[0]:.0f} s, {first_wave}last at {times[-1]:.0f} s; "
            f"prepare stages s: {stages}")


def device_states(details: list[dict]) -> str:
    """How each evaluation GPU's time went between the run's first and last checked evaluation (the gate's
    cumulative seconds per state, sandbox/gate.py DeviceGate.occupancy): the share measuring, in shared turns, in
    shared turns that a measurement waits out, and idle."""
    by_gpu: dict = {}
    for d in details:  # in the order they were recorded
        if isinstance(d.get("device_gate"), dict):
            by_gpu.setdefault(d.get("gpu_index"), []).append(d["device_gate"])
    parts = []
    for gpu, snapshots in sorted(by_gpu.items(), key=lambda item: str(item[0])):
        first, last = snapshots[0], snapshots[-1]
        spent = {k: last.get(k, 0.0) - first.get(k, 0.0) for k in last}
        total = sum(spent.values())
        if len(snapshots) < 2 or total <= 0:
            continue
        shares = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1]))
        parts.append(f"gpu {gpu}: {shares} of {total:.0f} s")
    return ("; device states: " + "; ".join(parts)) if parts else ""


def cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of the CPUs this process may run on, from /proc/stat; None off Linux."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine = {f"cpu{i}" for i in os.sched_getaffinity(0)}
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if name in mine:
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if not before or not after or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def run_task(name: str, args, device: str, out: Path) -> list[str]:
    home = Path(tempfile.mkdtemp(prefix=f"{Path(name).stem}-", dir=out))
    task = Path(name) if name.endswith(".py") else REPO / "benchmarks/tasks" / f"{name}.py"
    cmd = ["optimize", str(task.resolve()), "--proposer", "tune",
           "--max-candidates", str(args.max_candidates), "--json", "--device", device]
    if args.from_compile:
        cmd += ["--from", "compile"]
    elif args.from_kernels:  # the task's own honest kernel as the seed (the tuner finds its launch settings)
        cmd += ["--from", str((args.from_kernels / task.name).resolve())]
    if args.executor:
        cmd += ["--executor", args.executor]  # the cluster's GPUs: its workers say which they lend
    elif device == "cuda":
        cmd += ["--gpus", args.gpus]
    if args.in_flight:
        cmd += ["--workers", str(args.in_flight)]
    if args.max_wall:
        cmd += ["--max-wall", str(args.max_wall)]
    t0, ticks = time.perf_counter(), cpu_ticks()
    try:
        summary = appliance(home, *cmd)
    except KeyboardInterrupt:  # (SIGTERM: a time limit around the suite) the run killed, what it recorded kept
        return cut_row(name, home, time.perf_counter() - t0, busy_share(ticks, cpu_ticks()), args, device)
    wall = time.perf_counter() - t0  # around the whole command: start-up and the seed's input preparation count
    host_busy = busy_share(ticks, cpu_ticks())
    if "error" in summary:
        return [name, f"error: {summary['error']}"]
    seed, best = summary.get("seed") or {}, summary.get("best") or {}
    seed_t, best_t = main_timing(home, seed.get("evaluation_id")), main_timing(home, best.get("evaluation_id"))

    db = sqlite3.connect(home / "appliance.db")
    rows = [(datetime.fromisoformat(t), json.loads(d or "{}")) for t, d in db.execute(
        "SELECT created_at, details FROM evaluation WHERE run_id = ? ORDER BY created_at", (summary["run_id"],))]
    verdicts = [(t, details.get("gpu_index")) for t, details in rows]
    (started,), = db.execute("SELECT created_at FROM run WHERE id = ?", (summary["run_id"],)).fetchall()
    print(f"{name}: {where_time_went([details for _, details in rows], host_busy)}; "
          f"{start_up(datetime.fromisoformat(started), rows, args.in_flight)}", file=sys.stderr, flush=True)
    per_gpu = Counter(gpu for _, gpu in verdicts)
    sources = db.execute("SELECT id, source FROM candidate WHERE run_id = ? AND status = 'evaluated' ORDER BY id",
                         (summary["run_id"],)).fetchall()
    db.close()

    n_gpus = (len(per_gpu) if args.executor else len(args.gpus.split(","))) if device == "cuda" else 1
    per_gpu_hour = summary["evaluated"] / (wall / 3600) / n_gpus
    steady = steady_rate(verdicts)
    unit = " (CPU)" if device == "cpu" else ""
    roof = best_t.get("roofline_fraction")
    row = [Path(name).stem, str(summary["evaluated"]),
           f"{fmt(seed_t.get('median_ms'), '.4g')} -> {fmt(best_t.get('median_ms'), '.4g')}{unit}",
           fmt(best.get("speedup_vs_eager"), ".3g", "x"), fmt(best.get("speedup_vs_compile"), ".3g", "x"),
           fmt(roof * 100 if roof else None, ".0f", "%"), (best.get("note") or "-").replace("|", "\\|"),
           f"{wall:.0f}", f"{per_gpu_hour:.0f}", fmt(steady, ".0f"),
           ", ".join(f"{'cpu' if g is None else f'gpu {g}'}: {n}" for g, n in sorted(per_gpu.items(), key=str))]

    if args.compare_naive:
        # The same sources the appliance evaluated, as files, through the KernelBench-style loop on one GPU.
        files = []
        for cid, source in sources[:args.naive_max]:
            path = home / "naive" / f"candidate-{cid}.py"
            path.parent.mkdir(exist_ok=True)
            path.write_text(source)
            files.append(path)
        for inputs in naive_inputs(args):
            naive = run_candidates(task, files, device,
                                   gpu=int(args.gpus.split(",")[0]), log=lambda line: print(line, file=sys.stderr),
                                   inputs=inputs)
            ratio = per_gpu_hour / naive["per_hour"] if naive["per_hour"] else None
            row += [fmt(naive["per_hour"], ".0f"), fmt(ratio, ".2f", "x")]
    return row


def cut_row(name: str, home: Path, wall: float, host_busy: float | None, args, device: str) -> list[str]:
    """The row of a run cut off by a time limit before its own summary came: its evaluations so far, from its
    database, over the wall time until the cut (what a GPU call's limit would otherwise lose whole)."""
    path = home / "appliance.db"
    if not path.exists():
        return [Path(name).stem, "0 (cut)", "-", "-", "-", "-", "cut by a time limit before any run was made"]
    db = sqlite3.connect(path)
    rows = [(datetime.fromisoformat(t), json.loads(d or "{}")) for t, d in db.execute(
        "SELECT created_at, details FROM evaluation WHERE run_id = (SELECT max(id) FROM run) ORDER BY created_at")]
    db.close()
    verdicts = [(t, details.get("gpu_index")) for t, details in rows]
    print(f"{name}: cut at {wall:.0f} s; {where_time_went([d for _, d in rows], host_busy)}", file=sys.stderr,
          flush=True)
    per_gpu = Counter(gpu for _, gpu in verdicts)
    n_gpus = (len(per_gpu) if args.executor else len(args.gpus.split(","))) if device == "cuda" else 1
    return [Path(name).stem, f"{len(rows)} (cut)", "-", "-", "-", "-", "the run was cut by a time limit: no summary",
            f"{wall:.0f}", f"{len(rows) / (wall / 3600) / max(n_gpus, 1):.0f}", fmt(steady_rate(verdicts), ".0f"),
            ", ".join(f"{'cpu' if g is None else f'gpu {g}'}: {n}" for g, n in sorted(per_gpu.items(), key=str))]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def naive_inputs(args) -> list[str]:
    return [i.strip() for i in args.naive_inputs.split(",")] if args.compare_naive else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="softmax,rmsnorm,layernorm",
                        help="bundled task names, or paths to task files (NAME.py)")
    parser.add_argument("--from-compile", action="store_true",
                        help="start every run from torch.compile's kernels (--from compile), not the bundled baseline")
    parser.add_argument("--from-kernels", type=Path, help="start each task T.py from DIR/T.py (e.g. "
                        "benchmarks/bare/kernels: bare KernelBench files, derived shapes on)")
    parser.add_argument("--max-candidates", type=int, default=12)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--gpus", default="0", help="evaluation GPUs, e.g. 0,1 (cuda only)")
    parser.add_argument("--max-wall", type=float, help="per task: the run's wall budget, seconds (fits a time slot)")
    parser.add_argument("--compare-naive", action="store_true")
    parser.add_argument("--naive-max", type=int, help="--compare-naive on at most this many of the run's candidates "
                        "(its rate is per candidate; fits a time slot)")
    parser.add_argument("--naive-inputs", default="cpu,device", help="with --compare-naive: where the naive "
                        "harness draws inputs, cpu (as KernelBench), device, or both (default)")
    parser.add_argument("--in-flight", type=int, help="evaluations in flight per device (default: the CLI's)")
    parser.add_argument("--executor", help="e.g. a Ray cluster's GCS address HOST:PORT (default: local workers on --gpus)")
    parser.add_argument("--out", type=Path, help="where run databases and results.md go (default: a temp dir)")
    parser.add_argument("--copy-dbs", type=Path, help="also copy each run's database to DIR/TASK.db and results.md to "
                        "DIR as soon as the task is done (flat: e.g. the GPU machine's $OUT, which returns shallow "
                        "files only)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # a time limit's TERM: the task in hand still gets its row (cut_row)

    from appliance.evaluation.pipeline import resolve_device

    device = resolve_device(args.device)  # resolved once, so the appliance and the naive harness agree
    out = args.out or Path(tempfile.mkdtemp(prefix="optimize-suite-"))
    out.mkdir(parents=True, exist_ok=True)
    if not set(naive_inputs(args)) <= set(NAIVE_COLUMNS):
        parser.error(f"--naive-inputs: cpu, device or both, not {args.naive_inputs!r}")
    columns = COLUMNS + [c for inputs in naive_inputs(args) for c in NAIVE_COLUMNS[inputs]]
    where = f"executor {args.executor}" if args.executor else f"gpus {args.gpus if device == 'cuda' else '-'}"
    header = (f"\nOptimisation loop on {device} ({where}), tuner, "
              f"--max-candidates {args.max_candidates}; run databases under {out}; MemTotal at the start "
              f"{fmt(mem_total_gib(), '.0f')} GiB\n\n"
              f"| {' | '.join(columns)} |\n|{'---|' * len(columns)}")
    lines = [header]
    print(header, flush=True)
    for name in args.tasks.split(","):
        cells = run_task(name.strip(), args, device, out)
        row = f"| {' | '.join(cells + ['-'] * (len(columns) - len(cells)))} |"
        print(row, flush=True)
        lines.append(row)
        if cells[1].endswith("(cut)"):
            break  # (the time limit is over: no later task)
        (out / "results.md").write_text("\n".join(lines) + "\n")  # kept even if a later task is cut off
        if args.copy_dbs:
            args.copy_dbs.mkdir(parents=True, exist_ok=True)
            shutil.copy(out / "results.md", args.copy_dbs / "results.md")
            stem = Path(name.strip()).stem
            for db in out.glob(f"{stem}-*/appliance.db"):
                shutil.copy(db, args.copy_dbs / f"{stem}.db")
    return 0


if __name__ == "__main__":
    sys.exit(main())
