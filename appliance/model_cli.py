"""`appliance model ...`: serve a model profile with vLLM, check a running server, list the profiles.

Exit codes: 0 fine, 1 the server has problems (check) or vLLM failed to come up (serve --wait), 2 a bad profile,
missing weights or usage error."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from appliance.errors import ApplianceError
from appliance.models import Profile, available, check, load_profile, preflight, vllm_command, weights_problem

model_app = typer.Typer(help="LLM server: serve a model profile with vLLM, check it, list profiles.",
                        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
# soft_wrap: a problem stays one line however narrow the terminal, whole in logs and greppable.
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def _error(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _load(name: str, port: int | None = None, gpu: int | None = None) -> Profile:
    try:
        profile = load_profile(name)
    except ApplianceError as e:
        _error(str(e), e.exit_code)
    update = {k: v for k, v in (("port", port), ("gpu", gpu)) if v is not None}
    return profile.model_copy(update=update) if update else profile


@model_app.command("list")
def list_(as_json: JsonFlag = False) -> None:
    """The bundled profiles (models/*.toml, or APPLIANCE_MODEL_PROFILES) and whether their weights are here."""
    rows = []
    for name in available():
        try:
            p = load_profile(name)
            rows.append({"name": name, "description": p.description, "served_name": p.served_name,
                         "device": p.device, "gpus": p.gpus if p.device == "cuda" else [], "port": p.port,
                         "weights_dir": p.weights_dir, "weights_present": weights_problem(p) is None})
        except ApplianceError as e:  # one broken file must not hide the others
            rows.append({"name": name, "error": str(e)})
    if as_json:
        print(json.dumps({"profiles": rows}))
        return
    table = Table(title="Model profiles")
    for col in ("profile", "served name", "device", "port", "weights", "description"):
        table.add_column(col)
    for r in rows:
        if "error" in r:
            table.add_row(r["name"], "", "", "", "[red]invalid[/]", r["error"])
            continue
        device = r["device"] + (f" {','.join(map(str, r['gpus']))}" if r["gpus"] else "")
        weights = "[green]present[/]" if r["weights_present"] else "[yellow]missing[/]"
        table.add_row(r["name"], r["served_name"], device, str(r["port"]), weights, r["description"])
    out.print(table)


@model_app.command()
def serve(
    profile_name: Annotated[str, typer.Argument(metavar="PROFILE", help="Profile name (models/NAME.toml) or file.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the command and its environment; start nothing.")
                       ] = False,
    wait: Annotated[bool, typer.Option(
        "--wait/--no-wait", help="--no-wait (default): replace this process with vLLM (what systemd supervises). "
                                 "--wait: run vLLM as a child, report once it answers /health, a test completion "
                                 "included, then stay with it until it exits.")] = False,
    port: Annotated[Optional[int], typer.Option(help="Override the profile's port.")] = None,
    gpu: Annotated[Optional[int], typer.Option(help="Override the profile's LLM GPU index.")] = None,
    wait_timeout: Annotated[float, typer.Option(help="--wait: seconds to wait for /health.")] = 900.0,
) -> None:
    """Start vLLM's OpenAI-compatible server for PROFILE, in the foreground, offline, on the profile's GPU only."""
    profile = _load(profile_name, port, gpu)
    argv, extra_env = vllm_command(profile)
    problems = preflight(profile)
    if dry_run:
        print(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(extra_env.items())), *map(shlex.quote, argv)]))
        for problem in problems:  # worth knowing before the real start, but a dry run starts nothing
            err.print(f"[yellow]warning:[/] {problem}", highlight=False)
        return
    if problems:
        _error(f"cannot serve {profile.name}:\n" + "\n".join(f"  - {p}" for p in problems))
    env = {**os.environ, **extra_env}
    err.print(f"serving {profile.name} as {profile.served_name!r} at {profile.base_url}", highlight=False)
    if not wait:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvpe(argv[0], argv, env)  # same PID: systemd's stop and restart reach vLLM itself
    raise typer.Exit(_serve_and_wait(profile, argv, env, wait_timeout))


def _serve_and_wait(profile: Profile, argv: list[str], env: dict[str, str], timeout_s: float) -> int:
    # Own process group: vLLM starts engine processes, and stopping must end all of them.
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    asked: list[int] = []

    def stop_now(signum, _frame):
        # At any moment, start-up included: vLLM may not act on a signal while its engine starts, so the whole
        # group is stopped here (SIGTERM, then SIGKILL after the grace), from this process's main loop.
        asked.append(signum)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_now)
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(profile):
            if proc.poll() is not None:
                err.print(f"[bold red]error:[/] vLLM exited with {proc.returncode} before answering /health; "
                          "its log is above", highlight=False)
                return 1
            if time.monotonic() > deadline:
                err.print(f"[bold red]error:[/] no /health from {profile.base_url} after {timeout_s:g} s; stopping it")
                return 1
            time.sleep(1)
        problems = check(profile.base_url, profile.served_name, max_tokens=1)  # the window is the client's concern
        for problem in problems:
            err.print(f"[bold red]problem:[/] {problem}", highlight=False)
        if not problems:
            err.print(f"[green]ready:[/] {profile.base_url} serves {profile.served_name!r}; for the proposer: "
                      f"APPLIANCE_LLM_URL={profile.base_url} APPLIANCE_LLM_MODEL={profile.served_name}"
                      + (f" APPLIANCE_LLM_MAX_TOKENS={profile.max_tokens}" if profile.max_tokens else ""),
                      highlight=False, soft_wrap=True)
        code = proc.wait()
        return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention
    except KeyboardInterrupt:
        signum = asked[-1] if asked else signal.SIGINT
        err.print(f"stopping vLLM ({signal.Signals(signum).name}): its whole process group", highlight=False)
        _stop(proc)
        return 128 + signum
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # (a second signal must not cut the stop short)
        if proc.poll() is None:
            _stop(proc)
        _reap_group(proc.pid)


def _healthy(profile: Profile) -> bool:
    try:
        with urllib.request.urlopen(f"http://{profile.host}:{profile.port}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _reap_group(pgid: int) -> None:
    """vLLM's engine processes are in its group; one left behind (its parent gone first) is killed."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


@model_app.command("check")
def check_(
    url: Annotated[Optional[str], typer.Option(help="vLLM's OpenAI base URL, ending in /v1 (default: the profile's, "
                                                    "else APPLIANCE_LLM_URL, else http://127.0.0.1:8000/v1).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Served model name (default: the profile's, else "
                                                      "APPLIANCE_LLM_MODEL).")] = None,
    profile_name: Annotated[Optional[str], typer.Option("--profile", metavar="PROFILE",
                                                        help="Take the URL and model from this profile.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Completion tokens the proposer will ask for: must fit "
                                                           "the model's window (default: APPLIANCE_LLM_MAX_TOKENS, "
                                                           "else the profile's max_tokens, else 4096).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per request.")] = 60.0,
    as_json: JsonFlag = False,
) -> None:
    """Probe /health, /v1/models and a test completion; say what is wrong and how to fix it (exit 1), or exit 0."""
    from appliance.config import Settings

    s = Settings.load()  # the proposer's own settings: the check judges what the proposer will really use
    profile = _load(profile_name) if profile_name else None
    url = url or (profile.base_url if profile else None) or s.llm_url or "http://127.0.0.1:8000/v1"
    model = model or (profile.served_name if profile else None) or s.llm_model
    if max_tokens is None:  # what the proposer will use: the environment's, else the profile's, else 4096
        max_tokens = (s.llm_max_tokens if s.llm_max_tokens_set or not (profile and profile.max_tokens)
                      else profile.max_tokens)
    problems = check(url, model, max_tokens=max_tokens, api_key=s.llm_api_key, timeout_s=timeout)
    if problems and problems[0].startswith("no vLLM server"):
        start = f"appliance model serve {profile.name}" if profile else "appliance model serve PROFILE"
        problems[0] += f" ({start} starts one)"
    if as_json:
        print(json.dumps({"ok": not problems, "url": url, "model": model, "max_tokens": max_tokens,
                          "problems": problems}))
    elif problems:
        for problem in problems:
            err.print(f"[bold red]problem:[/] {problem}", highlight=False)
    else:
        out.print(f"[green]ok:[/] {url} serves {model!r}: /health, /v1/models, the window for max_tokens="
                  f"{max_tokens} and a test completion all answered", highlight=False)
    raise typer.Exit(1 if problems else 0)
