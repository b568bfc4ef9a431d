"""`appliance` command line. The only place that wires settings, store, jail and pipeline together.

Exit codes: 0 success (for `eval`: the candidate passed), 1 candidate rejected, 2 usage or task error,
3 the appliance cannot evaluate on this host (e.g. no jail).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from appliance.config import Settings
from appliance.errors import ApplianceError
from appliance.evaluation.pipeline import EvalSettings, Outcome, Pipeline
from appliance.tasks import load_task

app = typer.Typer(help="Kernel Optimizer Appliance: verified GPU kernel speedups, on your own hardware.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


class State:
    settings: Settings


state = State()


@app.callback()
def main(
    db: Annotated[Optional[str], typer.Option("--db", metavar="URL",
                                              help="SQLAlchemy database URL (env APPLIANCE_DB_URL; "
                                                   "default: SQLite file under APPLIANCE_HOME).")] = None,
) -> None:
    state.settings = Settings.load(db)


def _store():
    from appliance.db.store import Store

    return Store.open(state.settings.db_url)


def _fail(e: ApplianceError, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"error": str(e), "kind": type(e).__name__}))
    else:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
    raise typer.Exit(e.exit_code)


@app.command("eval")
def eval_(
    task: Annotated[Path, typer.Argument(help="KernelBench-format task file (a TASK.toml beside it is its manifest).")],
    candidate: Annotated[Path, typer.Argument(help="Candidate file defining ModelNew.")],
    as_json: JsonFlag = False,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "auto",
    mode: Annotated[Optional[str], typer.Option(help="Size mode: small | full (default: full on GPU, small on CPU).")] = None,
    baselines: Annotated[str, typer.Option(help="Comma-separated baselines to time: eager, compile.")] = "eager,compile",
    gpu: Annotated[Optional[int], typer.Option(help="Evaluation GPU index (default 0 when the device is cuda).")] = None,
    timeout: Annotated[float, typer.Option(help="Wall-clock limit for the candidate process, seconds.")] = 600.0,
    timing_budget: Annotated[float, typer.Option(help="Seconds of timed calls per shape and implementation.")] = 1.0,
    keep_job_dir: Annotated[bool, typer.Option(help="Keep the job directory (inputs, outputs, logs) for debugging.")] = False,
    memory_limit: Annotated[float, typer.Option(help="Memory limit per jailed process, GiB (cgroup).")] = 32.0,
    pids_limit: Annotated[int, typer.Option(help="Processes + threads limit per jailed process tree (cgroup).")] = 1024,
    profile: Annotated[bool, typer.Option(help="GPU: add an Nsight Compute summary (DRAM throughput, occupancy, "
                                               "top stalls) when the candidate passes.")] = False,
    unsafe_no_jail: Annotated[bool, typer.Option(
        "--unsafe-no-jail", help="DEVELOPMENT ONLY: run the candidate WITHOUT the jail (env APPLIANCE_UNSAFE_NO_JAIL=1). "
                                 "Every verdict is marked unjailed.")] = False,
) -> None:
    """Evaluate CANDIDATE against TASK: load/compile -> correctness -> timing; store and print the verdict."""
    from appliance.evaluation.pipeline import resolve_device
    from sandbox.jail import Jail

    s = state.settings
    unsafe = unsafe_no_jail or s.unsafe_no_jail
    names = tuple(b.strip() for b in baselines.split(",") if b.strip())
    if set(names) - {"eager", "compile"} or (mode not in (None, "small", "full")) or device not in ("auto", "cpu", "cuda"):
        err.print("error: --baselines takes eager,compile; --mode small|full; --device auto|cpu|cuda")
        raise typer.Exit(2)
    try:
        t = load_task(task)
        dev = resolve_device(device)
        jail = Jail(unsafe_no_jail=unsafe, gpu=(gpu or 0) if dev == "cuda" else None,
                    memory_bytes=int(memory_limit * 2**30), pids_max=pids_limit)
        settings = EvalSettings(device=dev, mode=mode, baselines=names, timing_budget_s=timing_budget,
                                candidate_timeout_s=timeout, jobs_dir=s.jobs_dir, keep_job_dir=keep_job_dir,
                                state_dir=s.home, profile=profile)
        if unsafe:
            err.print("[bold red]UNSAFE: --unsafe-no-jail: the candidate runs WITHOUT the jail.[/]")
        outcome = Pipeline(jail, settings).evaluate(t, candidate)
        evaluation_id, run_id = _record(t, candidate, outcome, settings)
    except ApplianceError as e:
        _fail(e, as_json)
    if as_json:
        print(json.dumps(_outcome_json(outcome, evaluation_id, run_id), default=str))
    else:
        _print_outcome(outcome, evaluation_id)
    raise typer.Exit(0 if outcome.passed else 1)


def _record(task, candidate: Path, outcome: Outcome, settings: EvalSettings) -> tuple[int, int]:
    store = _store()
    row = store.get_or_add_task(task.name, str(task.path), task.source, task.manifest_text)
    run = store.add_run(row.id, "eval", {"device": outcome.device, "mode": outcome.mode,
                                         "baselines": list(settings.baselines)})
    cand = store.add_candidate(run.id, row.id, candidate.read_text(errors="replace"), path=str(candidate.resolve()))
    ev = store.add_evaluation(
        cand.id, run.id, verdict=outcome.verdict, stage=outcome.stage, reason=outcome.reason, jailed=outcome.jailed,
        device=outcome.device, mode=outcome.mode, speedup_vs_eager=outcome.speedup_vs_eager,
        speedup_vs_compile=outcome.speedup_vs_compile, environment=outcome.environment, details=outcome.details,
        timings=[{k: t.get(k) for k in ("shape", "sizes", "implementation", "device", "median_ms", "iqr_ms",
                                        "gbps", "tflops", "roofline_fraction", "device_wide_ms", "energy_j_per_call",
                                        "min_ms", "reps", "error")} for t in outcome.timings],
    )
    store.finish_run(run.id, "finished")
    return ev.id, run.id


def _outcome_json(o: Outcome, evaluation_id: int, run_id: int) -> dict:
    return {
        "verdict": o.verdict, "stage": o.stage, "reason": o.reason, "passed": o.passed,
        "jailed": o.jailed, "device": o.device, "mode": o.mode,
        "speedup_vs_eager": o.speedup_vs_eager, "speedup_vs_compile": o.speedup_vs_compile,
        "timings": o.timings, "environment": o.environment, "evaluation_id": evaluation_id, "run_id": run_id,
        "wall_s": o.details.get("wall_s"), "evidence": o.details.get("evidence"), "ncu": o.details.get("ncu"),
    }


def _ms(value: float | None, iqr: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" + (f" ±{iqr:.2g}" if iqr is not None else "")


def _print_outcome(o: Outcome, evaluation_id: int) -> None:
    color = "green" if o.passed else "red"
    head = Table.grid(padding=(0, 2))
    head.add_row("verdict", f"[bold {color}]{o.verdict}[/]")
    head.add_row("stage", o.stage)
    head.add_row("reason", o.reason)
    head.add_row("device", f"{o.device} ({o.mode} sizes)" + ("" if o.jailed else "  [bold red]UNJAILED[/]"))
    head.add_row("stored", f"evaluation {evaluation_id}")
    out.print(head)
    if o.timings:
        _print_timings(o.timings, o.device)


def _evidence(t: dict) -> tuple[str, str]:
    roof, joules = t.get("roofline_fraction"), t.get("energy_j_per_call")
    return (f"{roof:.0%}" if roof else "-"), (f"{joules * 1e3:.3g}" if joules else "-")


def _print_timings(timings: list[dict], device: str) -> None:
    unit = "ms" if device == "cuda" else "ms, CPU"
    table = Table(title=f"Median time per call ({unit}) ± IQR")
    gpu_evidence = any(t.get("roofline_fraction") or t.get("energy_j_per_call") for t in timings)
    for col in ("shape", "candidate", "eager", "torch.compile", "vs eager", "vs compile") + (
            ("roofline", "mJ/call") if gpu_evidence else ()):
        table.add_column(col, justify="left" if col == "shape" else "right")
    by_shape: dict[str, dict] = {}
    for t in timings:
        by_shape.setdefault(t["shape"], {})[t["implementation"]] = t
    for shape, impls in by_shape.items():
        c, e, k = (impls.get(n, {}) for n in ("candidate", "eager", "compile"))

        def ratio(base):
            return f"{base['median_ms'] / c['median_ms']:.3g}x" if base.get("median_ms") and c.get("median_ms") else "-"

        table.add_row(shape, _ms(c.get("median_ms"), c.get("iqr_ms")), _ms(e.get("median_ms"), e.get("iqr_ms")),
                      _ms(k.get("median_ms"), k.get("iqr_ms")) if not k.get("error") else "failed",
                      ratio(e), ratio(k), *(_evidence(c) if gpu_evidence else ()))
    out.print(table)


@app.command()
def tasks(as_json: JsonFlag = False) -> None:
    """List the bundled task suite (benchmarks/tasks, or APPLIANCE_SUITE)."""
    suite = state.settings.suite_dir
    rows = []
    for path in sorted(suite.glob("*.py")):
        try:
            t = load_task(path)
        except ApplianceError as e:
            rows.append({"name": path.stem, "path": str(path), "error": str(e)})
            continue
        baseline = suite.parent / "baselines" / path.name
        rows.append({
            "name": t.name, "path": str(path), "description": t.manifest.description, "dtype": t.manifest.dtype,
            "sizes": t.sizes, "small_sizes": t.shapes("small")[0].sizes,
            "extra_shapes": [s.name for s in t.manifest.shapes],
            "baseline": str(baseline) if baseline.is_file() else None,
        })
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title=f"Tasks in {suite}")
    for col in ("name", "description", "dtype", "sizes (full)", "extra shapes", "baseline"):
        table.add_column(col)
    for r in rows:
        if "error" in r:
            table.add_row(r["name"], f"[red]{r['error']}[/]", "", "", "", "")
            continue
        sizes = ", ".join(f"{k}={v}" for k, v in r["sizes"].items())
        table.add_row(r["name"], r["description"], r["dtype"] or "as get_inputs", sizes,
                      ", ".join(r["extra_shapes"]), "yes" if r["baseline"] else "-")
    out.print(table)


@app.command()
def history(
    as_json: JsonFlag = False,
    task: Annotated[Optional[str], typer.Option(help="Only evaluations of this task name.")] = None,
    limit: Annotated[int, typer.Option(help="Newest N evaluations.")] = 50,
) -> None:
    """List stored evaluations, newest first."""
    rows = _store().list_evaluations(limit=limit, task_name=task)
    if as_json:
        print(json.dumps([_asdict(r) for r in rows], default=str))
        return
    table = Table(title="Evaluations")
    for col in ("id", "when", "task", "candidate", "verdict", "stage", "vs eager", "vs compile", "device"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(str(r.id), f"{r.created_at:%m-%d %H:%M}", r.task_name, Path(r.candidate_path or "-").name,
                      r.verdict, r.stage, _x(r.speedup_vs_eager), _x(r.speedup_vs_compile), r.device)
    out.print(table)
    out.print("`appliance show ID` prints an evaluation's reason, environment and timings.")


@app.command()
def runs(
    as_json: JsonFlag = False,
    limit: Annotated[int, typer.Option(help="Newest N runs.")] = 50,
) -> None:
    """List runs (each `eval` is a one-candidate run), newest first."""
    rows = _store().list_runs(limit=limit)
    if as_json:
        print(json.dumps([_asdict(r) for r in rows], default=str))
        return
    table = Table(title="Runs")
    for col in ("id", "when", "task", "kind", "status", "candidates", "evaluations", "best vs eager"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(str(r.id), f"{r.created_at:%m-%d %H:%M}", r.task_name, r.kind, r.status,
                      str(r.candidates), str(r.evaluations), _x(r.best_speedup_vs_eager))
    out.print(table)


@app.command()
def show(
    evaluation_id: Annotated[int, typer.Argument(help="Evaluation id (see `appliance history`).")],
    as_json: JsonFlag = False,
) -> None:
    """Show one stored evaluation: verdict, reason, environment and timings per shape."""
    found = _store().get_evaluation(evaluation_id)
    if found is None:
        err.print(f"error: no evaluation {evaluation_id}")
        raise typer.Exit(2)
    ev, timings = found
    data = ev.model_dump() | {"timings": [t.model_dump() for t in timings]}
    if as_json:
        print(json.dumps(data, default=str))
        return
    head = Table.grid(padding=(0, 2))
    for key in ("id", "created_at", "verdict", "stage", "reason", "device", "mode", "jailed"):
        head.add_row(key, str(data[key]))
    head.add_row("environment", ", ".join(f"{k}={v}" for k, v in (ev.environment or {}).items()))
    out.print(head)
    if timings:
        _print_timings(data["timings"], ev.device)


@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """Check what this host provides for jailed evaluation (bwrap, seccomp, cgroups, GPU, database).

    Exits 3 when candidates cannot be jailed or evaluated here."""
    from appliance import doctor as checks

    results = checks.run_checks(state.settings.db_url)
    report = checks.as_json(results)
    if as_json:
        print(json.dumps(report))
    else:
        table = Table(title="appliance doctor")
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col)
        for c in results:
            status = "[green]ok[/]" if c.ok else ("[red]FAIL[/]" if c.required else "[yellow]warn[/]")
            table.add_row(c.name, status, c.detail, c.fix)
        out.print(table)
        out.print("The jail enforces:")
        for line in checks.enforced():
            out.print(f"  - {line}")
    raise typer.Exit(0 if report["ok"] else 3)


def _x(value: float | None) -> str:
    return f"{value:.3g}x" if value else "-"


def _asdict(row) -> dict:
    from dataclasses import asdict, is_dataclass

    return asdict(row) if is_dataclass(row) else dict(row._asdict())


if __name__ == "__main__":
    sys.exit(app())
