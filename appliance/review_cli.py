"""Commands for steering and review: `appliance tui`, `approve`, `reject`, `approvals`, `export`, `recheck`.
cli.py calls register(app); settings come from cli's --db callback like every other command."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from appliance.errors import ApplianceError

out = Console()
err = Console(stderr=True)


def _settings():
    from appliance.cli import state  # set by cli's callback (--db, APPLIANCE_*); imported late: cli imports us

    return state.settings


def _store():
    from appliance.db import Store

    return Store.open(_settings().db_url)


def _fail(e: ApplianceError, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps({"error": str(e), "kind": type(e).__name__}))
    else:
        err.print(f"[bold red]error:[/] {e}", highlight=False)
    raise typer.Exit(e.exit_code)


def register(app: typer.Typer) -> None:
    if any((c.name or c.callback.__name__) == "export" for c in app.registered_commands):
        return  # already there (tests register on the real app too)

    @app.command()
    def tui(
        run: Annotated[Optional[int], typer.Option(help="Open this run's screen directly.")] = None,
        poll: Annotated[float, typer.Option(help="Seconds between looks at the database.")] = 1.0,
    ) -> None:
        """Terminal UI: runs, a run's live leaderboard, candidates' source/diff/evidence; pause, resume, stop,
        budget, new run, submit a file, approve or reject the winner. Keys are shown at the bottom; works over SSH."""
        from appliance.tui import Actions, ApplianceApp

        store = _store()
        ApplianceApp(store, Actions(store, _settings().db_url), poll_s=poll, run_id=run).run()

    @app.command()
    def approve(
        candidate: Annotated[int, typer.Argument(help="Candidate id (see `appliance tui` or `show`).")],
        comment: Annotated[str, typer.Option(help="Why it may ship (required).")],
        who: Annotated[Optional[str], typer.Option(help="Who decides (default: the OS user).")] = None,
    ) -> None:
        """Approve a candidate that passed the gate: it becomes its run's winner for `export` and `recheck`."""
        _decide(candidate, "approve", comment, who)

    @app.command()
    def reject(
        candidate: Annotated[int, typer.Argument(help="Candidate id.")],
        comment: Annotated[str, typer.Option(help="Why not (required).")],
        who: Annotated[Optional[str], typer.Option(help="Who decides (default: the OS user).")] = None,
    ) -> None:
        """Reject a candidate (withdraws an earlier approval of it)."""
        _decide(candidate, "reject", comment, who)

    @app.command()
    def approvals(
        run: Annotated[Optional[int], typer.Argument(metavar="[RUN]", help="Only this run's decisions.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """List review decisions (who, when, why), oldest first."""
        rows = _store().approvals(run)
        if as_json:
            print(json.dumps([a.model_dump() for a in rows], default=str))
            return
        table = Table(title="Review decisions")
        for column in ("id", "when (UTC)", "run", "candidate", "decision", "who", "comment"):
            table.add_column(column)
        for a in rows:
            table.add_row(str(a.id), f"{a.created_at:%Y-%m-%d %H:%M}", str(a.run_id), str(a.candidate_id), a.decision,
                          a.who, a.comment)
        out.print(table)

    @app.command()
    def export(
        run: Annotated[int, typer.Argument(metavar="RUN")],
        out_dir: Annotated[Optional[Path], typer.Option("--out", help="Directory (default ./export-run-RUN).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ) -> None:
        """Write the approved winner (or, if none is approved, the best candidate, marked NOT APPROVED) as a patch
        against the task's source and a drop-in module, plus report.md and a self-contained report.html."""
        from appliance.export import export_run

        try:
            done = export_run(_store(), run, out_dir or Path(f"export-run-{run}"))
        except ApplianceError as e:
            _fail(e, as_json)
        if as_json:
            print(json.dumps(asdict(done), default=str))
            return
        status = "approved winner" if done.approved else "[bold yellow]NOT APPROVED[/] best candidate"
        out.print(f"run {run}: {status} {done.candidate_id} exported to {done.out_dir}")
        for path in done.files:
            out.print(f"  {path}")

    @app.command()
    def recheck(
        runs: Annotated[Optional[list[int]], typer.Argument(metavar="[RUN]...",
                                                            help="Only these runs' winners.")] = None,
        device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "auto",
        gpu: Annotated[Optional[int], typer.Option(help="Evaluation GPU index (default 0 when cuda).")] = None,
        timing_budget: Annotated[float, typer.Option(
            help="Seconds of timed calls per shape and implementation.")] = 1.0,
        unsafe_no_jail: Annotated[bool, typer.Option(
            "--unsafe-no-jail", help="DEVELOPMENT ONLY: candidates run WITHOUT the jail.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON list.")] = False,
    ) -> None:
        """Evaluate every approved winner again on this host's GPU, driver and libraries; flag regressions (fails
        the gate now, or slower beyond the noise). Exit code 1 when any regressed."""
        from appliance.evaluation.pipeline import EvalSettings, resolve_device
        from appliance.recheck import recheck as run_recheck

        s = _settings()
        unsafe = unsafe_no_jail or s.unsafe_no_jail
        try:
            dev = resolve_device(device)
            jail = s.jail((gpu or 0) if dev == "cuda" else None, unsafe)
            # The baselines a search times (eager, and torch.compile on a GPU), so speedups read the same.
            settings = EvalSettings(device=dev, baselines=("eager", "compile") if dev == "cuda" else ("eager",),
                                    timing_budget_s=timing_budget, jobs_dir=s.jobs_dir, state_dir=s.home,
                                    host_memory_bytes=s.host_memory_bytes)
            log = (lambda _: None) if as_json else (lambda line: err.print(line, highlight=False))
            results = run_recheck(_store(), jail, settings, s.home / "rechecks", runs or None, log)
        except ApplianceError as e:
            _fail(e, as_json)
        if as_json:
            print(json.dumps([asdict(r) for r in results], default=str))
        elif not results:
            out.print("no approved winners to recheck (`appliance approve CANDIDATE --comment ...`)")
        else:
            table = Table(title="Recheck of approved winners")
            for column in ("run", "task", "candidate", "verdict", "vs eager", "result", "why"):
                table.add_column(column)
            for r in results:
                table.add_row(str(r.run_id), r.task, str(r.candidate_id), r.verdict,
                              f"{r.speedup_vs_eager:.3g}x" if r.speedup_vs_eager else "-",
                              "[bold red]REGRESSION[/]" if r.regressed else "[green]ok[/]", r.reason)
            out.print(table)
        raise typer.Exit(1 if any(r.regressed for r in results) else 0)


def _decide(candidate: int, decision: str, comment: str, who: str | None) -> None:
    from appliance.review import decide

    try:
        a = decide(_store(), candidate, decision, comment, who)
    except ApplianceError as e:
        _fail(e)
    out.print(f"candidate {candidate}: {decision} recorded (by {a.who}, {a.created_at:%Y-%m-%d %H:%M} UTC)")
