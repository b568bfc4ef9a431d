"""`appliance` command line. The only place that wires settings, store, jail and pipeline together.

Exit codes: 0 success (for `eval`: the candidate passed), 1 candidate rejected, 2 usage or task error,
3 the appliance cannot evaluate on this host (e.g. no jail).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from appliance.config import Settings
from appliance.errors import ApplianceError
from appliance import executors
from appliance.evaluation.pipeline import EvalSettings, Outcome, Pipeline
from appliance.model_cli import model_app
from appliance.search.loop import OptimizeConfig, Summary
from appliance.proposers.mix import build as build_proposers, parse_names
from appliance.search.seeding import choose_seed, starts_from
from appliance.evaluation.timings import CPU_TIMING_NOTE
from appliance.tasks import load_task

app = typer.Typer(help="Kernel Optimizer Appliance: verified GPU kernel speedups, on your own hardware.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(model_app, name="model")  # appliance model serve|check|list
out = Console()
err = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


def _use_executor(value: Optional[str]) -> None:
    """--executor beats APPLIANCE_EXECUTOR (an option callback: executors.pipelines reads it from the settings)."""
    if value:
        state.settings.executor = value


ExecutorOption = Annotated[Optional[str], typer.Option(
    callback=_use_executor, metavar="WHERE",
    help="Where evaluations run: local (this host; default: `controller` uses one worker process per GPU, "
         "`optimize` and `submit` evaluate in-process), workers (one worker process per GPU, `appliance worker`, "
         "also for optimize), or a Ray cluster: ray://HOST:PORT, auto (one worker per GPU of the cluster). "
         "Env APPLIANCE_EXECUTOR.")]



class State:
    settings: Settings


state = State()


@app.callback()
def main(
    db: Annotated[Optional[str], typer.Option("--db", metavar="URL",
                                              help="SQLAlchemy database URL (env APPLIANCE_DB_URL; "
                                                   "default: SQLite file under APPLIANCE_HOME).")] = None,
) -> None:
    try:
        state.settings = Settings.load(db)
    except ApplianceError as e:  # a setting the appliance cannot use: say which, before any command runs
        _fail(e, as_json=False)


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
    memory_limit: Annotated[Optional[float], typer.Option(
        help="Memory limit per jailed process, GiB (cgroup; default APPLIANCE_JAIL_MEMORY_GIB or 32).")] = None,
    pids_limit: Annotated[Optional[int], typer.Option(
        help="Processes + threads per jailed process tree (default APPLIANCE_JAIL_PIDS or 1024).")] = None,
    disk_limit: Annotated[Optional[float], typer.Option(
        help="What a jailed process may write to its job folders, GiB, beside the candidate's outputs (default "
             "APPLIANCE_JAIL_DISK_GIB or 16).")] = None,
    cpu_limit: Annotated[Optional[int], typer.Option(
        help="CPU seconds per jailed process (default APPLIANCE_JAIL_CPU_SECONDS, else every core for the whole "
             "timeout).")] = None,
    profile: Annotated[bool, typer.Option(help="GPU: add an Nsight Compute summary (DRAM throughput, occupancy, "
                                               "top stalls) when the candidate passes.")] = False,
    unsafe_no_jail: Annotated[bool, typer.Option(
        "--unsafe-no-jail", help="DEVELOPMENT ONLY: run the candidate WITHOUT the jail (env APPLIANCE_UNSAFE_NO_JAIL=1). "
                                 "Every verdict is marked unjailed.")] = False,
) -> None:
    """Evaluate CANDIDATE against TASK: load/compile -> correctness -> timing; store and print the verdict."""
    from appliance.evaluation.pipeline import resolve_device

    s = state.settings
    unsafe = unsafe_no_jail or s.unsafe_no_jail
    names = tuple(b.strip() for b in baselines.split(",") if b.strip())
    if set(names) - {"eager", "compile"} or (mode not in (None, "small", "full")) or device not in ("auto", "cpu", "cuda"):
        err.print("error: --baselines takes eager,compile; --mode small|full; --device auto|cpu|cuda")
        raise typer.Exit(2)
    try:
        t = load_task(task)
        dev = resolve_device(device)
        limits = {k: v for k, v in dict(memory_bytes=memory_limit and int(memory_limit * 2**30), pids_max=pids_limit,
                                         disk_bytes=disk_limit and int(disk_limit * 2**30),
                                         cpu_seconds=cpu_limit).items() if v}
        jail = s.jail((gpu or 0) if dev == "cuda" else None, unsafe, **limits)
        settings = EvalSettings(device=dev, mode=mode, baselines=names, timing_budget_s=timing_budget,
                                candidate_timeout_s=timeout, jobs_dir=s.jobs_dir, keep_job_dir=keep_job_dir,
                                state_dir=s.home, profile=profile, host_memory_bytes=s.host_memory_bytes)
        if unsafe:
            err.print("[bold red]UNSAFE: --unsafe-no-jail: the candidate runs WITHOUT the jail.[/]")
        pipeline = Pipeline(jail, settings)
        with contextlib.ExitStack() as live:
            if not as_json and err.is_terminal:  # stages as they happen; nothing of this under --json or in a pipe
                status = live.enter_context(err.status("checking the candidate's text", spinner="dots"))
                started = time.monotonic()
                pipeline.progress = lambda stage: status.update(f"{stage} ({time.monotonic() - started:.0f} s "
                                                                "so far)")
            try:
                outcome = pipeline.evaluate(t, candidate)
            finally:
                pipeline.close()
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
    ev = store.add_outcome(cand.id, run.id, outcome)
    store.finish_run(run.id, "finished")
    return ev.id, run.id


def _outcome_json(o: Outcome, evaluation_id: int, run_id: int) -> dict:
    return {
        "verdict": o.verdict, "stage": o.stage, "reason": o.reason, "passed": o.passed,
        "jailed": o.jailed, "memory_limited": o.memory_limited, "device": o.device, "mode": o.mode,
        "speedup_vs_eager": o.speedup_vs_eager, "speedup_vs_compile": o.speedup_vs_compile,
        # On the CPU the ratios are of interpreted kernels against native eager: kept, marked, never GPU speed.
        "speedups_measured_on": "cuda" if o.device == "cuda" else "cpu-interpreter",
        "timings": o.timings, "environment": o.environment, "evaluation_id": evaluation_id, "run_id": run_id,
        "wall_s": o.details.get("wall_s"), "evidence": o.details.get("evidence"), "ncu": o.details.get("ncu"),
        "shapes": checked_shapes(o.details), "dropped_shapes": o.details.get("dropped_shapes", []),
        "precompiled_headers": o.details.get("precompiled_headers"),  # load_inline candidates only
    }


def checked_shapes(details: dict) -> list[dict]:
    """The shapes an evaluation checked: sizes, inputs, where each came from (the file, the manifest, derived)."""
    keys = ("name", "sizes", "origin", "distribution", "layout", "timed")
    return [{k: s.get(k) for k in keys} for s in (details or {}).get("shapes") or []]


def _print_shapes(details: dict) -> None:
    shapes, dropped = checked_shapes(details), (details or {}).get("dropped_shapes") or []
    if not shapes and not dropped:
        return
    table = Table(title="Shapes checked (derived ones: correctness only)")
    for col in ("shape", "sizes", "inputs", "layout", "from"):
        table.add_column(col)
    for s in shapes:
        table.add_row(str(s["name"]), ", ".join(f"{k}={v}" for k, v in (s["sizes"] or {}).items()),
                      str(s["distribution"] or "default"), str(s["layout"] or "contiguous"), str(s["origin"] or ""))
    for d in dropped:
        table.add_row(str(d.get("name")), ", ".join(f"{k}={v}" for k, v in (d.get("sizes") or {}).items()), "", "",
                      f"dropped: the task's Model cannot run it ({str(d.get('reason'))[:120]})")
    out.print(table)


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
    head.add_row("device", f"{o.device} ({o.mode} sizes)" + ("" if o.jailed else "  [bold red]UNJAILED[/]")
                 + ("" if o.memory_limited else "  [bold red]NO MEMORY LIMIT[/]"))
    head.add_row("stored", f"evaluation {evaluation_id}")
    out.print(head)
    _print_shapes(o.details)
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
            if not (base.get("median_ms") and c.get("median_ms")):
                return "-"
            return f"{base['median_ms'] / c['median_ms']:.3g}x" if device == "cuda" else "cpu"

        table.add_row(shape, _ms(c.get("median_ms"), c.get("iqr_ms")), _ms(e.get("median_ms"), e.get("iqr_ms")),
                      _ms(k.get("median_ms"), k.get("iqr_ms")) if not k.get("error") else "failed",
                      ratio(e), ratio(k), *(_evidence(c) if gpu_evidence else ()))
    out.print(table)
    if device != "cuda":
        out.print(f"[dim]{CPU_TIMING_NOTE}.[/]", soft_wrap=True)


@app.command()
def optimize(
    task: Annotated[Optional[Path], typer.Argument(help="Task file (KernelBench format). Not needed with --resume.")] = None,
    start_from: Annotated[Optional[Path], typer.Option(
        "--from", help="Seed candidate (a ModelNew that passes the gate), or `compile`: torch.compile's own "
                       "kernels written out. Default: the bundled baseline benchmarks/baselines/NAME.py when the "
                       "task is from the bundled suite, else torch.compile's kernels.")] = None,
    proposer: Annotated[Optional[str], typer.Option(
        help="tune (parameter tuner) | llm (APPLIANCE_LLM_URL) | llm:PROFILE (a model profile's server), or several "
             "comma-separated (tune,llm:fast,llm:strong): a bandit gives each slot to the one with the best gain per "
             "GPU-second and token so far. Default: llm when an endpoint is configured, else tune.")] = None,
    max_candidates: Annotated[Optional[int], typer.Option(help="Budget: evaluated candidates (default 20).")] = None,
    max_gpu_seconds: Annotated[Optional[float], typer.Option(help="Budget: GPU seconds of evaluation.")] = None,
    max_wall: Annotated[Optional[float], typer.Option(help="Budget: wall seconds of the run, over all sessions.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Budget: LLM tokens (prompt + completion).")] = None,
    stop_at_roofline: Annotated[Optional[float], typer.Option(
        help="Finish once a passing candidate reaches this fraction of the roofline at the main shape (GPU only; "
             "0: never; default 0.95).")] = None,
    batch: Annotated[int, typer.Option(help="Proposals per generation.")] = 2,
    islands: Annotated[int, typer.Option(help="Islands of the evolutionary database.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of every random choice of the search (reproducible runs).")] = 0,
    resume: Annotated[Optional[int], typer.Option(help="Continue run RUN (after a pause, a stop or a crash).")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "auto",
    mode: Annotated[Optional[str], typer.Option(help="Size mode: small | full (default: full on GPU).")] = None,
    timing_budget: Annotated[float, typer.Option(help="Seconds of timed calls per shape and implementation.")] = 1.0,
    workers: Annotated[Optional[int], typer.Option(
        help="Evaluations in flight per device (default: half the cores per GPU, 3 to 8; 1 on the CPU). Their "
             "loading, compiling and checking overlap; correctness and timing take turns on the device, and only as "
             "many as fit in 90% of its memory hold it at once.")] = None,
    gpus: Annotated[Optional[str], typer.Option(help="Evaluation GPUs, e.g. 1,2 (default: every visible GPU).")] = None,
    executor: ExecutorOption = None,
    unsafe_no_jail: Annotated[bool, typer.Option(
        "--unsafe-no-jail", help="DEVELOPMENT ONLY: candidates run WITHOUT the jail.")] = False,
    queue: Annotated[bool, typer.Option("--queue", help="Only create the run; `appliance controller` runs it.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Search for a faster verified kernel: propose -> evaluate -> select until a budget runs out.
    Every step is in the database: a run killed at any moment continues with --resume RUN."""
    from appliance.search.loop import Optimizer, config_dict

    s = state.settings
    try:
        if stop_at_roofline is not None and not 0 <= stop_at_roofline <= 1:
            raise ApplianceError(f"--stop-at-roofline {stop_at_roofline}: give a fraction of the roofline between 0 "
                                 "and 1 (0.95 stops at 95%; 0 never stops)")
        store = _store()
        if resume is not None:
            run = store.get_run(resume)
            if run is None or run.kind != "optimize":
                raise ApplianceError(f"no optimize run {resume} (see `appliance runs`)")
            config = OptimizeConfig.from_dict(run.config)
            for name, value in (("max_candidates", max_candidates), ("max_gpu_seconds", max_gpu_seconds),
                                ("max_wall_s", max_wall), ("max_tokens", max_tokens)):
                if value is not None:  # a resumed run may get a bigger budget
                    setattr(config, name, value)
            if stop_at_roofline is not None:  # (or search on past the roofline it stopped at)
                config.stop_at_roofline = stop_at_roofline or None
            store.update_run(run.id, config=config_dict(config))
            t = _task_of_run(store, run)
        else:
            if task is None:
                raise ApplianceError("give a TASK file, or --resume RUN")
            t = load_task(task)
            names = parse_names(proposer or ("llm" if s.llm_url else "tune"))
            start = choose_seed(s, task, t, start_from, names, device, mode, gpus, unsafe_no_jail or s.unsafe_no_jail,
                                None if as_json else _say_plain)
            config = OptimizeConfig(proposer=",".join(names), max_candidates=max_candidates or 20,
                                    max_gpu_seconds=max_gpu_seconds, max_wall_s=max_wall, max_tokens=max_tokens,
                                    batch=batch, islands=islands, seed=seed, device=device, mode=mode,
                                    timing_budget_s=timing_budget, workers=workers or 0,
                                    stop_at_roofline=0.95 if stop_at_roofline is None else stop_at_roofline or None)
            row = store.get_or_add_task(t.name, str(t.path), t.source, t.manifest_text)
            run = store.add_run(row.id, "optimize", config_dict(config))
            store.add_candidate(run.id, row.id, start.source, path=start.path, proposer=start.proposer,
                                status="queued", island=0, generation=0, note=start.note)
            if queue:
                store.update_run(run.id, status="queued", config=config_dict(config) | {"controller": True})
                print(json.dumps({"run_id": run.id, "status": "queued"}) if as_json else
                      f"run {run.id} queued for `appliance controller`")
                return
        try:
            proposers = _proposers(config)  # (an LLM run with no endpoint fails here, before any worker starts)
            pipelines = executors.pipelines(s, config, gpus, unsafe_no_jail or s.unsafe_no_jail, _say)
        except ApplianceError:
            if run.status == "created":  # made by this command: not left `created` forever (`runs` shows why)
                store.update_run(run.id, status="failed")
            raise
        log = (lambda _: None) if as_json else (lambda line: err.print(f"[dim]run {run.id}:[/] {_plain(line)}",
                                                                        highlight=False))
        with contextlib.ExitStack() as live:
            status = None
            if not as_json and err.is_terminal:  # a live line under the log; nothing of it in a pipe or --json
                spinner = live.enter_context(err.status(f"run {run.id}: starting", spinner="dots"))
                status = spinner.update
            optimizer = Optimizer(store, run.id, t, pipelines, proposers, config,
                                  s.home / "runs" / str(run.id), log,
                                  screens=executors.compile_screens(s, config, pipelines,
                                                                    unsafe_no_jail or s.unsafe_no_jail, _say),
                                  status=status)
            summary = optimizer.run()
    except ApplianceError as e:
        _fail(e, as_json)
    _print_summary(summary, as_json)


@app.command()
def controller(
    metrics_port: Annotated[int, typer.Option(help="Port of the Prometheus /metrics endpoint (0: none).")] = 9464,
    metrics_addr: Annotated[str, typer.Option(help="Address /metrics listens on.")] = "0.0.0.0",
    poll: Annotated[float, typer.Option(help="Seconds between looks at the queue when it is empty.")] = 2.0,
    executor: ExecutorOption = None,
    unsafe_no_jail: Annotated[bool, typer.Option(
        "--unsafe-no-jail", help="DEVELOPMENT ONLY: candidates run WITHOUT the jail.")] = False,
) -> None:
    """The daemon: run queued optimize runs (`appliance optimize --queue`, the TUI) one after another on the
    evaluation GPUs, one evaluation worker process per GPU (`appliance worker`: systemd's appliance-worker@N, or
    started and restarted by the controller), and serve Prometheus metrics. SIGTERM finishes the evaluation in
    flight, puts the run back in the queue and exits."""
    import signal
    import threading

    from appliance.db.store import display_url
    from appliance.metrics import Metrics
    from appliance.worker import WorkerSupervisor

    s = state.settings
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    metrics = Metrics()
    if metrics_port:
        try:
            metrics.serve(metrics_port, metrics_addr)
        except OSError as e:
            err.print(f"[bold red]error:[/] cannot serve metrics on {metrics_addr}:{metrics_port}: {e} "
                      "(another controller? pick --metrics-port)")
            raise typer.Exit(3)
    store = _store()
    from appliance.controller import requeue_orphaned_runs

    requeue_orphaned_runs(store)
    err.print(f"controller: metrics on :{metrics_port}, database {display_url(s.db_url)}", highlight=False)
    # One evaluation worker process per GPU, kept across runs: systemd's appliance-worker@N where they listen,
    # else children of this process, started again when they die (appliance/worker.py).
    try:
        supervisor = WorkerSupervisor(
            s.home, metrics=metrics, persistent=True,
            log=lambda line: err.print(f"controller: {line}", highlight=False, soft_wrap=True))
    except ApplianceError as e:  # e.g. a workers' authkey others can read
        _fail(e, False)
    try:
        _controller_loop(store, stop, poll, supervisor, metrics, unsafe_no_jail)
    finally:
        supervisor.close()
    err.print("controller: stopped", highlight=False)


def _controller_loop(store, stop, poll: float, supervisor, metrics, unsafe_no_jail: bool) -> None:
    from appliance.controller import serve_queue
    from appliance.search.loop import Optimizer

    s = state.settings

    def run_one(run) -> str:
        config = OptimizeConfig.from_dict(run.config)
        pipelines = executors.pipelines(s, config, None, unsafe_no_jail, _say, supervisor)
        optimizer = Optimizer(store, run.id, _task_of_run(store, run), pipelines, _proposers(config), config,
                              s.home / "runs" / str(run.id),
                              log=lambda line, rid=run.id: err.print(f"run {rid}: {_plain(line)}", highlight=False),
                              metrics=metrics, should_stop=stop.is_set,
                              screens=executors.compile_screens(s, config, pipelines, unsafe_no_jail, _say))
        return optimizer.run().status

    serve_queue(store, stop, poll, run_one, log=lambda line: err.print(line, highlight=False))


@app.command()
def submit(
    run_id: Annotated[int, typer.Argument(metavar="RUN", help="The optimize run to add the candidate to.")],
    candidate: Annotated[Path, typer.Argument(help="Candidate file defining ModelNew.")],
    as_json: JsonFlag = False,
) -> None:
    """Evaluate a person's candidate inside a run and rank it among the run's candidates."""
    from appliance.search.loop import Optimizer, summarize

    s = state.settings
    try:
        store = _store()
        run = store.get_run(run_id)
        if run is None or run.kind != "optimize":
            raise ApplianceError(f"no optimize run {run_id} (see `appliance runs`)")
        if not candidate.is_file():
            raise ApplianceError(f"no such candidate file: {candidate}")
        config = OptimizeConfig.from_dict(run.config)
        t = _task_of_run(store, run)
        row = store.add_candidate(run.id, run.task_id, candidate.read_text(errors="replace"),
                                  path=str(candidate.resolve()), proposer="manual", status="queued", island=0,
                                  note=f"submitted by hand: {candidate.name}")
        optimizer = Optimizer(store, run.id, t, executors.pipelines(s, config, None, s.unsafe_no_jail, _say), [], config,
                              s.home / "runs" / str(run.id))
        optimizer.evaluate([row])
        ranked = [c.id for c, e in sorted(((c, e) for c, e in store.run_candidates(run.id)
                                           if e and e.verdict == "pass"), key=lambda ce: -(ce[1].speedup_vs_eager or 0))]
        evaluation = next(e for c, e in store.run_candidates(run.id) if c.id == row.id)
    except ApplianceError as e:
        _fail(e, as_json)
    rank = ranked.index(row.id) + 1 if row.id in ranked else None
    result = {"run_id": run.id, "candidate_id": row.id, "evaluation_id": evaluation.id, "verdict": evaluation.verdict,
              "reason": evaluation.reason, "speedup_vs_eager": evaluation.speedup_vs_eager, "rank": rank,
              "passing": len(ranked), "best": summarize(store, run.id).best}
    if as_json:
        print(json.dumps(result, default=str))
    else:
        out.print(f"candidate c{row.id} (evaluation e{evaluation.id}; `appliance show c{row.id}`): "
                  f"[bold]{evaluation.verdict}[/] - {evaluation.reason}")
        out.print(f"rank {rank} of {len(ranked)} passing candidates" if rank else "not ranked (did not pass)")
    raise typer.Exit(0 if evaluation.verdict == "pass" else 1)


@app.command()
def pause(run_id: Annotated[int, typer.Argument(metavar="RUN")]) -> None:
    """Pause a running optimize run (it stops after the evaluation in flight; `optimize --resume RUN` goes on)."""
    _set_status(run_id, "paused")


@app.command()
def stop(run_id: Annotated[int, typer.Argument(metavar="RUN")]) -> None:
    """Stop an optimize run for good after the evaluation in flight (it can still be resumed explicitly)."""
    _set_status(run_id, "stopped")


def _set_status(run_id: int, status: str) -> None:
    store = _store()
    run = store.get_run(run_id)
    if run is None:
        err.print(f"[bold red]error:[/] no run {run_id}")
        raise typer.Exit(2)
    store.update_run(run_id, status=status)
    out.print(f"run {run_id}: {status}")


def _task_of_run(store, run):
    row = store.get_task(run.task_id)
    t = load_task(Path(row.path))
    if t.source != row.source:
        raise ApplianceError(f"the task file {row.path} changed since run {run.id} started; start a new run")
    return t


@app.command()
def worker(
    gpu: Annotated[str, typer.Option(help="The evaluation GPU this worker owns (nvidia-smi index), or cpu.")],
    socket_file: Annotated[Optional[Path], typer.Option(
        "--socket", help="Unix socket to serve on (default: APPLIANCE_HOME/workers/gpuN.sock, or cpu.sock; the "
                         "controller looks there).")] = None,
    slots: Annotated[Optional[int], typer.Option(
        min=1, help="Evaluations at once (default: half the cores, 3 to 8, on a GPU; 1 on the CPU); more wait "
                    "their turn.")] = None,
    parent: Annotated[Optional[int], typer.Option(hidden=True, help="Stop when this process (the supervisor that "
                                                                    "started the worker) is gone.")] = None,
    unsafe_no_jail: Annotated[bool, typer.Option(
        "--unsafe-no-jail", help="DEVELOPMENT ONLY: candidates run WITHOUT the jail (env "
                                 "APPLIANCE_UNSAFE_NO_JAIL=1).")] = False,
) -> None:
    """An evaluation worker: serve one GPU's (or the CPU's) jailed evaluations over a Unix socket to this host's
    `appliance controller` (and `optimize --executor workers`). One per evaluation GPU: systemd's
    appliance-worker@N, or the controller starts its own. SIGTERM finishes the evaluations in flight, then exits."""
    from appliance import worker as workers
    from appliance.evaluation.pipeline import default_slots
    from sandbox.jail import JailUnavailable

    s = state.settings
    try:
        g = workers.parse_gpu(gpu)
    except ValueError as e:
        err.print(f"error: {e}")
        raise typer.Exit(2)
    unsafe = unsafe_no_jail or s.unsafe_no_jail
    if unsafe:
        err.print("[bold red]UNSAFE: --unsafe-no-jail: candidates run WITHOUT the jail.[/]")

    def log(line: str) -> None:  # plain lines for the journal (rich would wrap them at 80 columns)
        print(f"worker {workers.label(g)}: {line}", file=sys.stderr, flush=True)

    try:
        path = socket_file or workers.socket_path(s.home, g)
        in_flight = slots or default_slots(0 if g is None else 1)
        server = workers.WorkerServer(g, path, in_flight, unsafe, s.home, s.jobs_dir, log, s.host_memory_bytes,
                                      jail=s.jail(g, unsafe))
        server.serve(parent)
    except (ApplianceError, JailUnavailable) as e:
        log(f"error: {e}")
        raise typer.Exit(3)


def _say(line: str) -> None:
    """A line for the operator on stderr (rich markup)."""
    err.print(line, highlight=False, soft_wrap=True)


def _say_plain(line: str) -> None:
    err.print(_plain(line), highlight=False, soft_wrap=True)


def _proposers(config: OptimizeConfig) -> list:
    """The run's proposers, by the names in config.proposer (proposers/mix.py)."""
    return build_proposers(parse_names(config.proposer), state.settings, config.seed)


def _print_summary(summary: Summary, as_json: bool) -> None:
    from dataclasses import asdict

    if as_json:
        print(json.dumps(asdict(summary), default=str))
        return
    out.print(f"run {summary.run_id}: [bold]{summary.status}[/] - {summary.evaluated} evaluated, "
              f"{summary.passed} passed, {summary.proposal_failures} proposal failures, "
              f"{summary.duplicates} duplicates skipped")
    for label, d in (("seed", summary.seed), ("best", summary.best)):
        if d:
            speed = (f"{_x(d['speedup_vs_eager'])} vs eager, " + (
                f"{_x(d['speedup_vs_compile'])} vs torch.compile" if d.get("speedup_vs_compile") else
                "torch.compile not timed (the loop times it on a GPU only: its first call compiles for minutes)")
                if d.get("device") == "cuda" else "timed on the CPU (Triton's interpreter): no GPU speed, no speedup")
            out.print(f"  {label}: candidate c{d['candidate_id']} ({d['proposer']}) {d['verdict']}, {speed}"
                      + (f" - {_plain(d['note'])}" if d.get("note") else ""), soft_wrap=True)
    if summary.finished_because:
        out.print(f"  {_plain(summary.finished_because)}", soft_wrap=True)
    out.print(f"  usage: {summary.usage}")
    for y in summary.proposers:
        out.print(f"  {_plain(y['line'])}", soft_wrap=True)


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
            "optimise_with": starts_from(baseline),
        })
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(title=f"Tasks in {suite}")
    for col in ("name", "description", "dtype", "sizes (full)", "extra shapes", "optimise with"):
        table.add_column(col)
    for r in rows:
        if "error" in r:
            table.add_row(r["name"], f"[red]{r['error']}[/]", "", "", "", "")
            continue
        sizes = ", ".join(f"{k}={v}" for k, v in r["sizes"].items())
        table.add_row(r["name"], r["description"], r["dtype"] or "as get_inputs", sizes,
                      ", ".join(r["extra_shapes"]), r["optimise_with"])
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
    table = _table("Evaluations")
    columns = ["id", "when", "task", "candidate", "verdict", "stage", "vs eager", "vs compile", "device"]
    if out.width < 110:  # a narrow terminal: the stage and device go (`show ID` has them), the rest stays legible
        columns = [c for c in columns if c not in ("stage", "device")]
    for col in columns:
        table.add_column(col, **_column(col, rows))
    for r in rows:
        cells = dict(zip(["id", "when", "task", "candidate", "verdict", "stage", "vs eager", "vs compile", "device"],
                         [str(r.id), f"{r.created_at:%m-%d %H:%M}", r.task_name, Path(r.candidate_path or "-").name,
                          r.verdict, r.stage, _x(r.speedup_vs_eager, r.device), _x(r.speedup_vs_compile, r.device),
                          r.device]))
        table.add_row(*(cells[c] for c in columns))
    out.print(table)
    out.print("`appliance show ID` prints an evaluation's reason, environment and timings.")


def _table(title: str) -> Table:
    from rich import box

    narrow = out.width < 110  # lighter borders and padding: 80 columns hold every id and number
    if narrow:
        return Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False,
                     show_edge=False)
    return Table(title=title)


def _column(name: str, rows) -> dict:
    """Rich column options: ids (what `show` and `--resume` take) and times are never squeezed on a narrow
    terminal; names give way first (with an ellipsis)."""
    if name == "id":
        return {"no_wrap": True, "min_width": max([2, *(len(str(r.id)) for r in rows)])}
    if name == "when":
        return {"no_wrap": True, "min_width": 11}
    if name == "proposers":
        return {"overflow": "fold"}
    if name in ("status", "verdict", "vs eager", "vs compile", "best vs eager"):
        return {"no_wrap": True}
    return {"no_wrap": True, "overflow": "ellipsis"}


@app.command()
def runs(
    as_json: JsonFlag = False,
    limit: Annotated[int, typer.Option(help="Newest N runs.")] = 50,
) -> None:
    """List runs (each `eval` is a one-candidate run), newest first."""
    from appliance.proposers.mix import run_yields

    store = _store()
    rows = store.list_runs(limit=limit)
    summaries = store.runs_summaries([r.id for r in rows if r.kind == "optimize"])
    yields = {r.id: run_yields(*summaries[r.id]) if r.id in summaries else [] for r in rows}
    if as_json:
        print(json.dumps([_asdict(r) | {"proposers": [y.as_dict() for y in yields[r.id]]} for r in rows],
                         default=str))
        return
    table = _table("Runs")
    columns = ["id", "when", "task", "kind", "status", "cands", "evals", "best vs eager", "proposers"]
    if out.width < 110:  # a narrow terminal: each run's proposers are in `optimize`'s summary and the TUI
        columns.remove("proposers")
    for col in columns:
        table.add_column(col, **_column(col, rows))
    for r in rows:
        # Each proposer: evaluated candidates that beat their parent / proposed, and the speed it found (x2 = 2x).
        found = ", ".join(f"{y.proposer} {y.improved}/{y.pulls}" + (f" x{2 ** y.gain:.3g}" if y.improved else "")
                          for y in yields[r.id]) or "-"
        cells = [str(r.id), f"{r.created_at:%m-%d %H:%M}", r.task_name, r.kind, r.status, str(r.candidates),
                 str(r.evaluations), _x(r.best_speedup_vs_eager), found]
        table.add_row(*cells[:len(columns)])
    out.print(table)
    if "proposers" in columns:
        out.print("proposers: candidates faster than their parent / proposed, and the speed they found together.")


@app.command()
def show(
    ident: Annotated[str, typer.Argument(
        metavar="ID", help="An evaluation (e31, or 31: see `appliance history`) or a candidate (c26: see `runs`, "
                           "`submit`, the TUI); a candidate shows its evaluation.")],
    as_json: JsonFlag = False,
) -> None:
    """Show one stored evaluation: verdict, reason, environment and timings per shape."""
    store = _store()
    kind, number = _parse_id(ident)
    if kind == "c":
        candidate = store.get_candidate(number)
        if candidate is None:
            err.print(f"error: no candidate c{number} (candidates are listed per run: `appliance runs`, the TUI)")
            raise typer.Exit(2)
        evaluation = next((e for c, e in store.run_candidates(candidate.run_id) if c.id == number), None)
        if evaluation is None:
            err.print(f"candidate c{number} has no evaluation: it is {candidate.status}"
                      + (f" ({candidate.failure})" if candidate.failure else ""))
            raise typer.Exit(1)
        number = evaluation.id
    found = store.get_evaluation(number)
    if found is None:
        err.print(f"error: no evaluation e{number} (`appliance history` lists them; a candidate's id is c{number})")
        raise typer.Exit(2)
    ev, timings = found
    data = ev.model_dump() | {"timings": [t.model_dump() for t in timings]}
    if as_json:
        print(json.dumps(data, default=str))
        return
    head = Table.grid(padding=(0, 2))
    head.add_row("evaluation", f"e{ev.id} (of candidate c{ev.candidate_id}, run {ev.run_id})")
    for key in ("created_at", "verdict", "stage", "reason", "device", "mode", "jailed", "memory_limited"):
        head.add_row(key, str(data[key]))
    head.add_row("environment", ", ".join(f"{k}={v}" for k, v in (ev.environment or {}).items()))
    out.print(head)
    _print_shapes(ev.details or {})
    if timings:
        _print_timings(data["timings"], ev.device)


def _parse_id(ident: str) -> tuple[str, int]:
    """("e", N) for an evaluation (eN, or a bare N as before), ("c", N) for a candidate (cN)."""
    text = ident.strip().lower()
    kind = text[0] if text[:1] in ("c", "e") else "e"
    digits = text[1:] if text[:1] in ("c", "e") else text
    if not digits.isdigit():
        raise typer.BadParameter(f"{ident!r}: give e31 (an evaluation), c26 (a candidate), or 31", param_hint="ID")
    return kind, int(digits)


@app.command()
def doctor(
    as_json: JsonFlag = False,
    metrics_port: Annotated[int, typer.Option(help="Check that this port is free for the controller (0: skip).")] = 9464,
) -> None:
    """Check this host: jail (bwrap, seccomp, cgroups, user namespaces), GPUs and their roles, torch/triton,
    database, LLM endpoint (APPLIANCE_LLM_URL), metrics port.

    Exits 3 when candidates cannot be jailed or evaluated here, or a configured LLM endpoint does not answer."""
    from appliance import doctor as checks

    s = state.settings
    jail = s.jail()
    results = checks.run_checks(s.db_url, s.llm_url, s.llm_model, metrics_port or None, s.jobs_dir,
                                s.host_memory_bytes, jail)
    report = checks.as_json(results, jail)
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
        out.print("The jail's policy (sandbox/policy.py), the value every run renders into bubblewrap's arguments:")
        for line in checks.policy_lines(jail):
            out.print(f"  {line}", highlight=False, soft_wrap=True)
    raise typer.Exit(0 if report["ok"] else 3)


def _plain(text: str) -> str:
    """Text that came from a candidate or a task (notes, reasons, stderr), safe on a terminal: no Rich markup, no
    control characters (escape sequences could retitle, clear or fake the screen)."""
    from rich.markup import escape

    return escape("".join(c if c in "\n\t" or (c.isprintable() and c != "\x1b") else "?" for c in str(text)))


def _x(value: float | None, device: str | None = "cuda") -> str:
    """A speedup as a table shows it; on the CPU none (interpreted kernels against native eager: no GPU speed)."""
    if device not in (None, "cuda"):
        return "cpu" if value else "-"
    return f"{value:.3g}x" if value else "-"


def _asdict(row) -> dict:
    from dataclasses import asdict, is_dataclass

    return asdict(row) if is_dataclass(row) else dict(row._asdict())


from appliance.review_cli import register as _register_review  # noqa: E402 - the commands need `app` defined

_register_review(app)  # appliance tui, approve, reject, approvals, export, recheck

if __name__ == "__main__":
    sys.exit(app())
