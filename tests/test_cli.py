"""The `appliance` command line: help, listings, where evaluations are stored (--db, APPLIANCE_DB_URL,
APPLIANCE_HOME), show, the jail being required (and the unsafe escape hatch), runs, and the installed entry points.
Evaluations are real (jailed harness processes, Triton interpreter on the CPU, SQLite files)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO, Appliance, candidate, run_in_terminal

COMMANDS = ("eval", "tasks", "history", "runs", "show")
EVAL_ARGS = ("--json", "--device", "cpu", "--baselines", "eager", "--timing-budget", "0.05")


def softmax_task() -> Path:
    return FIXTURES / "tasks" / "rowsoftmax.py"


def eval_with(appliance: Appliance, *global_opts: str, cand: str = "good", extra: tuple[str, ...] = ()):
    """`appliance [GLOBAL_OPTS] eval rowsoftmax CANDIDATE --json ...`: (exit code, JSON, stderr)."""
    result = appliance(*global_opts, "eval", softmax_task(), candidate(cand), *EVAL_ARGS, *extra)
    return result.exit_code, json.loads(result.stdout), result.stderr


def as_json(result) -> object:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def rows(db: Path, query: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(query).fetchall()


# --- help and listings, no evaluation ---


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_mentioning_json(appliance, command):
    result = appliance(command, "--help")
    assert result.exit_code == 0, result.output
    assert "--json" in result.stdout


def test_top_level_help_lists_commands_and_db_option(appliance):
    result = appliance("--help")
    assert result.exit_code == 0
    for word in (*COMMANDS, "--db"):
        assert word in result.stdout


def test_tasks_lists_the_bundled_suite(appliance, monkeypatch):
    monkeypatch.delenv("APPLIANCE_SUITE", raising=False)
    tasks = as_json(appliance("tasks", "--json"))
    suite = sorted(p.stem for p in (REPO / "benchmarks" / "tasks").glob("*.py"))
    assert len(tasks) == 12
    assert [t["name"] for t in tasks] == suite
    for t in tasks:
        assert "error" not in t, t
        assert t["baseline"] and Path(t["baseline"]).is_file() and Path(t["baseline"]).name == f"{t['name']}.py"
        assert t["description"] and t["extra_shapes"] and t["sizes"]
        assert t["small_sizes"].keys() == t["sizes"].keys()


def test_tasks_reports_a_broken_task_without_failing(appliance, monkeypatch, tmp_path):
    suite = tmp_path / "suite" / "tasks"
    suite.mkdir(parents=True)
    shutil.copy(softmax_task(), suite / "ok.py")
    (suite / "broken.py").write_text("def oops(:\n")
    monkeypatch.setenv("APPLIANCE_SUITE", str(suite))
    tasks = {t["name"]: t for t in as_json(appliance("tasks", "--json"))}
    assert set(tasks) == {"ok", "broken"}
    assert "syntax error" in tasks["broken"]["error"]
    assert tasks["ok"]["baseline"] is None and tasks["ok"]["sizes"] == {"batch_size": 8, "dim": 128}


@pytest.mark.parametrize("command", ["history", "runs"])
def test_listings_of_an_empty_database_are_empty(appliance, home, command):
    assert as_json(appliance(command, "--json")) == []
    assert (home / "appliance.db").is_file()  # created and migrated on first use


def test_show_unknown_evaluation_exits_2(appliance):
    result = appliance("show", "999")
    assert result.exit_code == 2
    assert "no evaluation e999" in result.stderr
    assert appliance("show", "999", "--json").exit_code == 2
    assert appliance("show", "c999").exit_code == 2 and "no candidate c999" in appliance("show", "c999").stderr
    assert appliance("show", "x9").exit_code == 2  # neither kind: a usage error that names both


def test_show_takes_a_candidates_id_and_an_evaluations_unambiguously(appliance, softmax_task):
    # Two evaluations first: candidate and evaluation numbers then differ (a run's seed is c1 and e1 otherwise).
    appliance.eval_json(softmax_task, candidate("syntax_error"))
    _, result = appliance.eval_json(softmax_task, candidate("no_modelnew"))
    by_eval = as_json(appliance("show", f"e{result['evaluation_id']}", "--json"))
    [(cand_id,)] = sqlite3.connect(os.environ["APPLIANCE_HOME"] + "/appliance.db").execute(
        "SELECT candidate_id FROM evaluation WHERE id = ?", (result["evaluation_id"],)).fetchall()
    by_cand = as_json(appliance("show", f"c{cand_id}", "--json"))
    assert by_eval["id"] == by_cand["id"] == result["evaluation_id"] and "no class ModelNew" in by_cand["reason"]
    shown = appliance("show", f"c{cand_id}").stdout
    assert f"e{result['evaluation_id']} (of candidate c{cand_id}" in " ".join(shown.split()), shown


def test_eval_with_bad_option_values_exits_2(appliance):
    for extra in (("--baselines", "eager,jit"), ("--mode", "huge"), ("--device", "tpu")):
        result = appliance("eval", softmax_task(), candidate("good"), *extra)
        assert result.exit_code == 2, extra
    assert as_json(appliance("history", "--json")) == []


# --- one jailed evaluation into the default database, shared by the tests that read it back ---


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """`appliance eval` of the honest candidate with only APPLIANCE_HOME set: (appliance, home, JSON result)."""
    home = tmp_path_factory.mktemp("cli") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("APPLIANCE_HOME", str(home))
        for var in ("APPLIANCE_DB_URL", "APPLIANCE_UNSAFE_NO_JAIL", "APPLIANCE_BWRAP"):
            mp.delenv(var, raising=False)
        appliance = Appliance()
        code, result, stderr = eval_with(appliance)
        assert code == 0, result
        assert "UNSAFE" not in stderr
        yield appliance, home, result


def test_default_database_is_under_appliance_home(evaluated):
    _, home, result = evaluated
    db = home / "appliance.db"
    assert db.is_file()
    assert rows(db, "SELECT id, verdict, jailed FROM evaluation") == [(result["evaluation_id"], "pass", 1)]
    assert result["jailed"] is True
    # Job directories live under APPLIANCE_HOME too, and are removed after the evaluation.
    assert (home / "jobs").is_dir() and list((home / "jobs").iterdir()) == []


def test_show_returns_the_stored_evaluation(evaluated):
    appliance, _, result = evaluated
    shown = as_json(appliance("show", str(result["evaluation_id"]), "--json"))
    assert shown["id"] == result["evaluation_id"] and shown["run_id"] == result["run_id"]
    for key in ("verdict", "stage", "reason", "jailed", "device", "mode", "speedup_vs_eager", "environment"):
        assert shown[key] == result[key], key
    assert shown["verdict"] == "pass" and shown["jailed"] is True and shown["mode"] == "small"
    env = shown["environment"]
    assert env["device"] == "cpu" and env["torch"] and env["triton"] and env["python"]
    stored = [(t["shape"], t["implementation"], t["median_ms"], t["reps"]) for t in shown["timings"]]
    printed = [(t["shape"], t["implementation"], t["median_ms"], t["reps"]) for t in result["timings"]]
    assert stored == printed and len(stored) == 6  # main, odd, single x candidate, eager
    sizes = {t["shape"]: t["sizes"] for t in shown["timings"]}
    assert sizes["main"] == {"batch_size": 4, "dim": 64} and sizes["single"] == {"batch_size": 1, "dim": 1}
    assert shown["details"]["cases"] and all(c["kind"] == "pass" for c in shown["details"]["cases"])


def test_show_prints_a_table_without_json(evaluated):
    appliance, _, result = evaluated
    shown = appliance("show", str(result["evaluation_id"]))
    assert shown.exit_code == 0
    assert "pass" in shown.stdout and "main" in shown.stdout


def test_eval_is_a_finished_one_candidate_run(evaluated):
    appliance, _, result = evaluated
    [run] = as_json(appliance("runs", "--json"))
    assert run["id"] == result["run_id"] and run["task_name"] == "rowsoftmax"
    assert (run["kind"], run["status"], run["candidates"], run["evaluations"]) == ("eval", "finished", 1, 1)
    assert run["finished_at"] is not None
    assert run["best_speedup_vs_eager"] == pytest.approx(result["speedup_vs_eager"])


def test_history_filters_by_task(evaluated):
    appliance, _, result = evaluated
    [row] = as_json(appliance("history", "--json", "--task", "rowsoftmax"))
    assert row["id"] == result["evaluation_id"]
    assert row["candidate_path"] == str(candidate("good").resolve())
    assert as_json(appliance("history", "--json", "--task", "softmax")) == []


# --- choosing the database ---


def test_db_option_stores_there_and_survives_a_crashed_candidate(appliance, home, tmp_path):
    db = tmp_path / "elsewhere" / "state.db"
    url = f"sqlite:///{db}"
    code, crashed, _ = eval_with(appliance, "--db", url, cand="segfaults")
    assert code == 1 and crashed["verdict"] == "crashed", crashed
    code, passed, _ = eval_with(appliance, "--db", url)
    assert code == 0 and passed["verdict"] == "pass", passed

    assert rows(db, "SELECT id, verdict FROM evaluation ORDER BY id") == [
        (crashed["evaluation_id"], "crashed"), (passed["evaluation_id"], "pass")]
    assert rows(db, "SELECT kind, status FROM run ORDER BY id") == [("eval", "finished")] * 2
    assert rows(db, "SELECT count(*) FROM task") == [(1,)]  # the same task file is stored once
    listed = as_json(appliance("--db", url, "history", "--json"))
    assert [r["verdict"] for r in listed] == ["pass", "crashed"]
    assert not (home / "appliance.db").exists()


def test_db_url_environment_variable_and_unsafe_environment_variable(appliance, home, tmp_path, monkeypatch):
    db = tmp_path / "from-env.db"
    monkeypatch.setenv("APPLIANCE_DB_URL", f"sqlite:///{db}")
    monkeypatch.setenv("APPLIANCE_UNSAFE_NO_JAIL", "1")
    code, result, stderr = eval_with(appliance)
    assert code == 0 and result["verdict"] == "pass", result
    assert result["jailed"] is False and "UNSAFE" in stderr
    assert rows(db, "SELECT id, jailed FROM evaluation") == [(result["evaluation_id"], 0)]
    assert not (home / "appliance.db").exists()
    # --db beats the environment.
    other = tmp_path / "flag.db"
    assert as_json(appliance("--db", f"sqlite:///{other}", "history", "--json")) == []
    assert other.is_file()


# --- the jail ---


def test_unsafe_no_jail_flag_evaluates_unjailed_and_says_so(appliance, home):
    code, result, stderr = eval_with(appliance, extra=("--unsafe-no-jail",))
    assert code == 0 and result["verdict"] == "pass", result
    assert result["jailed"] is False
    assert "UNSAFE" in stderr and "WITHOUT the jail" in stderr
    assert as_json(appliance("show", str(result["evaluation_id"]), "--json"))["jailed"] is False
    assert rows(home / "appliance.db", "SELECT jailed FROM evaluation") == [(0,)]


def assert_no_jail_refusal(appliance, *words: str) -> None:
    result = appliance("eval", softmax_task(), candidate("good"), *EVAL_ARGS)
    assert result.exit_code == 3, result.output
    out = json.loads(result.stdout)
    assert out["kind"] == "InfrastructureError"
    for word in words:
        assert word in out["error"], out["error"]
    assert "UNSAFE" not in result.stderr
    assert as_json(appliance("history", "--json")) == []
    assert as_json(appliance("runs", "--json")) == []


def test_no_bubblewrap_on_path_exits_3_with_install_hint(appliance, monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.delenv("APPLIANCE_BWRAP", raising=False)
    monkeypatch.setenv("PATH", str(empty))
    assert_no_jail_refusal(appliance, "bubblewrap", "not found", "apt-get install bubblewrap", "APPLIANCE_BWRAP",
                           "--unsafe-no-jail")


def test_bwrap_env_pointing_nowhere_exits_3(appliance, monkeypatch):
    monkeypatch.setenv("APPLIANCE_BWRAP", "/nonexistent/bwrap")
    assert_no_jail_refusal(appliance, "bubblewrap", "/nonexistent/bwrap", "apt-get install bubblewrap")


def test_bwrap_that_cannot_build_the_jail_exits_3(appliance, monkeypatch):
    monkeypatch.setenv("APPLIANCE_BWRAP", "/bin/false")
    assert_no_jail_refusal(appliance, "bubblewrap at /bin/false cannot create the jail", "namespaces")


# --- entry points ---


def test_python_dash_m_appliance_help(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "appliance", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: appliance" in proc.stdout
    for command in COMMANDS:
        assert command in proc.stdout


def test_console_script_is_installed_and_needs_arguments(tmp_path):
    bin_dir = Path(sys.executable).parent
    script = shutil.which("appliance", path=os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]))
    assert script, f"no `appliance` console script in {bin_dir} or on PATH"
    proc = subprocess.run([script, "eval"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=os.environ | {"APPLIANCE_HOME": str(tmp_path / "home")})
    assert proc.returncode == 2
    assert "Usage: appliance eval" in proc.stderr and "Missing argument" in proc.stderr
    assert proc.stdout == ""


def test_history_and_runs_keep_their_ids_at_80_columns(appliance, softmax_task, monkeypatch):
    """The id is what `show` and `--resume` take: a narrow terminal drops columns before it squeezes an id."""
    for _ in range(12):  # judged from the text: a second each
        assert appliance.eval_json(softmax_task, candidate("syntax_error"))[0] == 1
    monkeypatch.setenv("COLUMNS", "80")
    for command, title in (("history", "Evaluations"), ("runs", "Runs")):
        lines = appliance(command).stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), lines
        ids = [line.split()[0] for line in lines if line[:1].isdigit()]
        assert sorted(map(int, ids)) == list(range(1, 13)), (title, lines)


def test_eval_in_a_terminal_shows_its_stages_as_they_happen(home, softmax_task):
    """In a terminal (a pty, as over SSH) `eval` says what it is doing while it does it; in a pipe it does not."""
    code, screen = run_in_terminal([sys.executable, "-m", "appliance", "eval", str(softmax_task),
                                    str(candidate("good")), "--device", "cpu", "--baselines", "eager",
                                    "--timing-budget", "0.05"], timeout_s=180)
    assert code == 0
    assert b"preparing the task" in screen and b"the candidate, jailed" in screen, screen[-2000:]
    piped = subprocess.run([sys.executable, "-m", "appliance", "eval", str(softmax_task), str(candidate("syntax_error")),
                            "--device", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "checking the candidate" not in piped.stderr + piped.stdout


def test_text_from_a_task_or_a_candidate_cannot_drive_the_terminal():
    """Notes, reasons and stderr come from jailed code: no Rich markup (a stray [/] raised), no escape sequences."""
    import io

    from rich.console import Console

    from appliance.cli import _plain

    hostile = "[/][link=http://x]click[/link] \x1b]0;pwned\x07\x1b[2J done\n"
    shown = _plain(hostile)
    assert "\x1b" not in shown and "\x07" not in shown
    console = Console(file=io.StringIO(), force_terminal=True, highlight=False)
    console.print(f"run 1: {shown}")  # would raise MarkupError on the raw text
    printed = console.file.getvalue()
    assert "[/][link=http://x]click[/link]" in printed and "]0;pwned" not in printed.replace("?]0;", "")
