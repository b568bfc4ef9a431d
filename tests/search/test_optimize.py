"""The optimisation loop end to end on the CPU: real jail, real Triton kernels under the interpreter, real SQLite.
Budgets are tiny; what is tested is the path: propose -> evaluate -> select, crash and resume, bad proposals.
Where what is under test is the loop or a command's own logic (resume, pause and stop, a hand submission's rank,
per-shape settings, the live line), the verdicts are replayed (appliance/evaluation/replay.py: no jail, no kernel,
real SQLite), and the test says so; the others run the whole path."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance import executors
from appliance.db import Store
from appliance.evaluation.pipeline import Outcome
from appliance.evaluation.replay import ReplayEvaluator
from appliance.proposers.edits import source_hash
from appliance.proposers.tune import TuneProposer, current_values, read_per_shape
from appliance.search.loop import OptimizeConfig, Optimizer, config_dict
from appliance.tasks import load_task
from tests.conftest import REPO, candidate, run_in_terminal
from tests.fake_llm import completion
from tests.search.test_loop_faults import make_run, optimizer, passes

SOFTMAX = REPO / "benchmarks/tasks/softmax.py"
BRANCHY = REPO / "tests/fixtures/tasks/rowsoftmax_branchy.py"  # torch.compile breaks its graph: no compile seed
FAST = ("--device", "cpu", "--timing-budget", "0.05")


def optimize(appliance, *args: str) -> tuple[int, dict]:
    result = appliance("optimize", *args, *FAST, "--json")
    return result.exit_code, json.loads(result.stdout.strip().splitlines()[-1])


def rows(home: Path, query: str) -> list[tuple]:
    with sqlite3.connect(home / "appliance.db") as db:
        try:
            return db.execute(query).fetchall()
        except sqlite3.OperationalError:  # polled while the other process is still creating the schema
            return [(0,)]


def replayed(monkeypatch, decide=passes, **kwargs) -> ReplayEvaluator:
    """The CLI's evaluations replayed (`decide`: a function of the candidate's source) instead of run in the jail:
    the command's own wiring, the loop and the database are real. One slot, as the CLI gives the CPU."""
    evaluator = ReplayEvaluator(decide=decide, slots=1, **kwargs)
    monkeypatch.setattr(executors, "pipelines", lambda *args, **kw: [evaluator])
    return evaluator


def test_tuner_run_proposes_evaluates_and_keeps_the_best(appliance, home):
    code, summary = optimize(appliance, str(SOFTMAX), "--max-candidates", "3", "--batch", "2")
    assert code == 0, summary
    assert summary["status"] == "finished" and summary["evaluated"] == 3 and summary["passed"] == 3
    assert summary["seed"]["proposer"] == "seed" and summary["best"]["speedup_vs_eager"] > 0
    cands = rows(home, "SELECT id, parent_id, proposer, status, note FROM candidate ORDER BY id")
    assert cands[0][1:3] == (None, "seed")
    # Settings changed, or (once two are timed) each shape given the settings fastest there.
    assert all(c[2] == "tune" and ("->" in c[4] or c[4].startswith("per shape: ")) for c in cands[1:]), cands
    assert {c[3] for c in cands} == {"evaluated"}
    # One task, many candidates: inputs and baselines are prepared once and reused by the later candidates.
    prepare_s = [json.loads(d)["wall_s"]["prepare"] for (d,) in rows(home, "SELECT details FROM evaluation ORDER BY id")]
    assert prepare_s[0] > 0 and prepare_s[1:] == [0.0, 0.0]
    listed = json.loads(appliance("runs", "--json").stdout)
    assert listed[0]["kind"] == "optimize" and listed[0]["evaluations"] == 3


def test_a_finished_run_leaves_nothing_queued_and_a_resume_evaluates_what_it_left(tmp_path):
    """The loop's bookkeeping, verdicts replayed (`optimize --resume` itself: the killed run's test, and pause and
    stop's)."""
    store, run_id, cfg, _ = make_run(tmp_path, max_candidates=2, batch=3, islands=1)
    summary = optimizer(store, run_id, cfg, tmp_path, ReplayEvaluator(decide=passes, slots=1)).run()
    assert summary.status == "finished" and summary.evaluated == 2, summary
    statuses = [(c.id, c.status, c.failure) for c, _ in store.run_candidates(run_id)]
    assert "queued" not in {s for _, s, _ in statuses}, statuses
    left = {i: f for i, s, f in statuses if s == "not_evaluated"}
    assert left and all("--resume" in f for f in left.values()), statuses  # proposed past the budget, and says so
    # Resumed as `optimize --resume RUN --max-candidates N` does: the bigger budget stored, a new loop (process).
    store.update_run(run_id, config=config_dict(cfg) | {"max_candidates": 2 + len(left)})
    cfg = OptimizeConfig.from_dict(store.get_run(run_id).config)
    summary = optimizer(store, run_id, cfg, tmp_path, ReplayEvaluator(decide=passes, slots=1)).run()
    assert summary.status == "finished" and summary.evaluated == 2 + len(left), summary
    evaluated = {c.id for c, e in store.run_candidates(run_id) if e is not None}
    assert set(left) <= evaluated, (left, store.run_candidates(run_id))  # what was left, and nothing else


def test_a_run_killed_mid_evaluation_resumes_without_losing_or_repeating_work(appliance, home):
    env = os.environ | {"APPLIANCE_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "appliance", "optimize", str(SOFTMAX), "--max-candidates", "4",
                             "--batch", "1", *FAST], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:  # kill -9 while the second candidate is being evaluated
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            # (its job folder made too: the status is set a moment before the folder gets the task's copy)
            if (home / "appliance.db").exists() and rows(
                    home, "SELECT count(*) FROM candidate WHERE status = 'evaluating' AND id > 1")[0][0] \
                    and any((home / "jobs").rglob("task.py")):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never reached its second evaluation")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = rows(home, "SELECT id, candidate_id, created_at FROM evaluation ORDER BY id")
    assert len(first) >= 1
    left = list((home / "jobs").glob(f"appliance-jobs-{proc.pid}-*"))
    assert left and any(left[0].rglob("task.py")), "the killed run left no job folder (with its task copy) behind"

    code, summary = optimize(appliance, "--resume", "1")
    assert code == 0, summary
    assert list((home / "jobs").iterdir()) == []  # the killed run's folder swept, the resumed run's removed
    assert summary["evaluated"] == 4 and summary["status"] == "finished"
    after = rows(home, "SELECT id, candidate_id, created_at FROM evaluation ORDER BY id")
    assert after[: len(first)] == first  # finished evaluations kept as they were
    per_candidate = rows(home, "SELECT candidate_id, count(*) FROM evaluation GROUP BY candidate_id")
    assert all(n == 1 for _, n in per_candidate)  # nothing evaluated twice
    leftover = rows(home, "SELECT id, proposer, status, failure, generation FROM candidate WHERE status != 'evaluated'")
    assert leftover == [], rows(home, "SELECT id, parent_id, proposer, status, generation, note FROM candidate")


def test_pause_and_stop_are_noticed_and_resume_goes_on(appliance, home, monkeypatch):
    """`appliance pause` and `appliance stop` given (as from another shell) while a candidate is evaluated: that
    evaluation is recorded, and the run stops there; `optimize --resume` goes on where it was, with a bigger budget
    when given one. Verdicts replayed: the commands and the loop are under test."""
    cues, said = {2: "pause", 4: "stop"}, []  # the command given during the nth evaluation

    def decide(source: str) -> Outcome:
        if command := cues.get(len(evaluator.evaluated)):  # (one slot: evaluations one at a time)
            said.append(appliance(command, "1"))
        return passes(source)

    evaluator = replayed(monkeypatch, decide)
    code, summary = optimize(appliance, str(SOFTMAX), "--max-candidates", "6", "--batch", "2")
    assert code == 0 and summary["status"] == "paused" and summary["evaluated"] == 2, summary
    assert said[0].exit_code == 0 and "run 1: paused" in said[0].stdout
    assert rows(home, "SELECT status FROM run WHERE id = 1") == [("paused",)]
    left = rows(home, "SELECT id FROM candidate WHERE status = 'queued'")  # proposed: kept for the resume
    assert left, rows(home, "SELECT id, status FROM candidate")
    # A bigger budget on resume: the run goes on where it was.
    code, summary = optimize(appliance, "--resume", "1", "--max-candidates", "7")
    assert code == 0 and summary["status"] == "stopped" and summary["evaluated"] == 4, summary
    assert said[1].exit_code == 0 and rows(home, "SELECT status FROM run WHERE id = 1") == [("stopped",)]
    code, summary = optimize(appliance, "--resume", "1")  # (a stopped run resumes when asked; its budget kept)
    assert code == 0 and summary["status"] == "finished" and summary["evaluated"] == 7, summary
    assert len(said) == 2 and len(evaluator.evaluated) == 7  # nothing evaluated twice
    assert set(left) <= set(rows(home, "SELECT candidate_id FROM evaluation"))  # what the pause left, evaluated


def test_hand_submission_is_evaluated_inside_the_run_and_ranked(appliance, home, monkeypatch):
    """Verdicts replayed: the submission's path and its rank are under test (slightly_off's real verdict is
    tests/evaluation/test_verdicts.py's; a real `submit`, tests/tui/conftest.py's run)."""
    off = Outcome(verdict="wrong_output", stage="correctness", reason="max abs err 0.02 > tol", jailed=True,
                  device="cpu", mode="small")
    evaluator = replayed(monkeypatch, recorded={source_hash(candidate("slightly_off").read_text()): off})
    optimize(appliance, str(SOFTMAX), "--max-candidates", "1")
    result = appliance("submit", "1", str(REPO / "benchmarks/baselines/softmax.py"), "--json")
    # The same source as the seed is still evaluated: a person asked for it.
    sub = json.loads(result.stdout)
    assert result.exit_code == 0 and sub["verdict"] == "pass" and sub["rank"] in (1, 2) and sub["passing"] == 2
    assert evaluator.evaluated == [evaluator.evaluated[0]] * 2  # the seed's source, twice
    bad = appliance("submit", "1", str(candidate("slightly_off")), "--json")
    rejected = json.loads(bad.stdout)
    assert bad.exit_code == 1 and rejected["verdict"] == "wrong_output" and rejected["rank"] is None
    assert rows(home, "SELECT proposer FROM candidate ORDER BY id") == [("seed",), ("manual",), ("manual",)]


def test_garbage_from_the_llm_becomes_recorded_failures_and_the_run_ends_cleanly(appliance, home, monkeypatch,
                                                                                   fake_llm):
    # A model that answers nonsense: no code at all, then a diff that does not apply (repeated).
    server = fake_llm(completion("I think the kernel is fine as it is.", prompt_tokens=100, completion_tokens=20),
                      completion("<<<<<<< SEARCH\nthis line is not in the parent\n=======\nx = 1\n>>>>>>> REPLACE\n",
                                 prompt_tokens=100, completion_tokens=20))
    monkeypatch.setenv("APPLIANCE_LLM_URL", server.url)
    monkeypatch.setenv("APPLIANCE_LLM_MODEL", "m")
    code, summary = optimize(appliance, str(SOFTMAX), "--proposer", "llm", "--max-candidates", "5")
    assert code == 0, summary
    assert summary["evaluated"] == 1 and summary["proposal_failures"] >= 3  # three barren generations, then done
    failures = [f for (f,) in rows(home, "SELECT failure FROM candidate WHERE status = 'proposal_failed'")]
    assert any("no code block" in f for f in failures) and any("SEARCH text not found" in f for f in failures)
    assert summary["usage"]["llm_tokens"] == 120 * summary["proposal_failures"]
    prompt = server.requests[0]["messages"][-1]["content"]  # the parent (the seed) with its time at every shape
    assert "timings per shape: main (batch_size=4, dim=300) " in prompt and "edge (batch_size=3, dim=4097) " in prompt


@pytest.mark.llm
def test_a_run_mixes_the_tuner_and_two_served_models_and_reports_each_ones_yield(appliance, home, monkeypatch,
                                                                                  tmp_path):
    """Against real vLLM. `--proposer tune,llm:fast,llm:deep`: two model profiles (the test server serves the same weights under two
    names) and the tuner in one run; the bandit tries each, and the summary and `runs` give each one's yield."""
    url = os.environ.get("APPLIANCE_TEST_LLM_URL")
    if not url:
        pytest.skip("set APPLIANCE_TEST_LLM_URL (scripts/test_llm_server.sh start)")
    host_port = url.split("//")[1].split("/")[0]
    for profile, served in (("fast", "smollm2-135m"), ("deep", "smollm2-135m-deep")):
        (tmp_path / f"{profile}.toml").write_text(
            f'description = "the test model as {served}"\nweights_dir = "{tmp_path}"\nserved_name = "{served}"\n'
            f'device = "cpu"\nport = {host_port.split(":")[1]}\nmax_tokens = 64\n')  # (replies are cut: fast)
    monkeypatch.setenv("APPLIANCE_MODEL_PROFILES", str(tmp_path))
    monkeypatch.delenv("APPLIANCE_LLM_URL", raising=False)
    code, summary = optimize(appliance, str(REPO / "tests/fixtures/tasks/rowsoftmax.py"), "--from",
                             str(REPO / "tests/fixtures/candidates/shape_tuned.py"), "--proposer",
                             "tune,llm:fast,llm:deep", "--max-candidates", "3", "--max-tokens", "40000")
    assert code == 0, summary
    proposed = {p for (p,) in rows(home, "SELECT DISTINCT proposer FROM candidate")}
    assert {"tune", "llm:fast", "llm:deep"} <= proposed, proposed  # each arm tried
    by_name = {y["proposer"]: y for y in summary["proposers"]}
    assert set(by_name) == {"tune", "llm:fast", "llm:deep"}
    assert by_name["llm:fast"]["tokens"] > 0 and by_name["llm:deep"]["tokens"] > 0 and by_name["tune"]["tokens"] == 0
    assert by_name["tune"]["evaluated"] >= 1
    # The tiny model's proposals mostly fail: each one is a row, evaluated or a recorded proposal failure, and each
    # prompt fit the model's 2,048-token window (a small task and seed; none rejected as too long).
    llm_rows = rows(home, "SELECT status, failure FROM candidate WHERE proposer LIKE 'llm:%'")
    assert all(status in ("evaluated", "proposal_failed") for status, _ in llm_rows), llm_rows
    assert not any("llm_rejected" in (failure or "") for _, failure in llm_rows), llm_rows
    listed = json.loads(appliance("runs", "--json").stdout)[0]
    assert {y["proposer"] for y in listed["proposers"]} == {"tune", "llm:fast", "llm:deep"}


def test_proposer_lists_that_cannot_work_are_refused_with_what_works(appliance, home, monkeypatch, tmp_path):
    result = appliance("optimize", str(SOFTMAX), "--proposer", "tune,bogus", *FAST)
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "llm:PROFILE" in said and "'bogus'" in said, said
    monkeypatch.setenv("APPLIANCE_MODEL_PROFILES", str(tmp_path))
    result = appliance("optimize", str(SOFTMAX), "--proposer", "tune,llm:nowhere", *FAST)
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "unknown model profile 'nowhere'" in said, said
    assert [r["status"] for r in json.loads(appliance("runs", "--json").stdout)] == ["failed"]


def test_evaluations_in_flight_overlap_but_take_turns_on_the_device(appliance, home):
    code, summary = optimize(appliance, str(SOFTMAX), "--max-candidates", "5", "--batch", "1", "--workers", "3")
    assert code == 0, summary
    assert summary["evaluated"] == 5 and summary["passed"] == 5
    # The first generation is proposed from the seed while the seed is evaluated, and fills the two other slots
    # (though --batch is 1): nothing waits for the seed's verdict.
    first = rows(home, "SELECT c.source, c.parent_id, c.created_at FROM candidate c "
                       "WHERE c.proposer = 'tune' AND c.generation = 0")
    (seed_id, seed_verdict_at), = rows(home, "SELECT c.id, e.created_at FROM candidate c JOIN evaluation e "
                                             "ON e.candidate_id = c.id WHERE c.proposer = 'seed'")
    assert len(first) == 2 and len({source for source, _, _ in first}) == 2, first
    assert all(parent == seed_id and created < seed_verdict_at for _, parent, created in first), (first,
                                                                                                  seed_verdict_at)
    turns = [json.loads(d)["device_turns"] for (d,) in rows(home, "SELECT details FROM evaluation ORDER BY id")]
    # The seed: its prepare holds the device throughout, then the candidate's and the check's turns.
    assert turns[0]["held_s"] > 0 and all(t["held_s"] > 0 for t in turns)
    # Several in flight: one of them waited for another's turn at least once.
    assert any(t["wait_s"] > 0.01 for t in turns[1:]), turns


def test_a_run_whose_host_memory_fits_one_evaluation_at_a_time_still_completes(appliance, home, monkeypatch):
    """Three slots, host memory for less than one evaluation (APPLIANCE_HOST_MEMORY_GIB): they start one at a time,
    the others wait, and the run ends with every evaluation done."""
    monkeypatch.setenv("APPLIANCE_HOST_MEMORY_GIB", "0.5")
    # Three candidates fill the three slots at once (the first generation is proposed while the seed is evaluated):
    # whichever gets the memory first, the other two wait for it.
    code, summary = optimize(appliance, str(SOFTMAX), "--max-candidates", "3", "--batch", "1", "--workers", "3")
    assert code == 0, summary
    assert summary["evaluated"] == 3 and summary["passed"] == 3, summary
    held = [json.loads(d)["host_memory"] for (d,) in rows(home, "SELECT details FROM evaluation ORDER BY id")]
    assert all(h["budget_gib"] == 0.5 for h in held), held  # the setting, whole: one CPU device
    assert sum(h["wait_s"] > 0.5 for h in held) >= 2, held  # the first generation waited for the seed


def test_an_llm_run_without_a_seed_starts_from_the_reference(appliance, home, monkeypatch, fake_llm):
    # No kernel for this task anywhere, and torch.compile's cannot be written out (its graph breaks): the run's seed
    # is the reference as ModelNew (a library fallback); the model, shown that verdict, answers with a kernel of
    # its own, which passes.
    task = BRANCHY
    kernel = (REPO / "benchmarks/baselines/softmax.py").read_text()
    server = fake_llm(completion(f"Own Triton kernel:\n```python\n{kernel}```\n", prompt_tokens=50,
                                 completion_tokens=500))
    monkeypatch.setenv("APPLIANCE_LLM_URL", server.url)
    monkeypatch.setenv("APPLIANCE_LLM_MODEL", "m")
    code, summary = optimize(appliance, str(task), "--proposer", "llm", "--max-candidates", "2")
    assert code == 0, summary
    (seed_verdict, seed_source), (llm_verdict, _) = rows(
        home, "SELECT e.verdict, c.source FROM candidate c JOIN evaluation e ON e.candidate_id = c.id ORDER BY c.id")
    assert seed_verdict == "library_fallback" and "class ModelNew(nn.Module)" in seed_source
    assert llm_verdict == "pass" and summary["best"] is not None
    prompt = server.requests[0]["messages"][-1]["content"]
    assert "class ModelNew(nn.Module)" in prompt and "library_fallback" in prompt


def test_a_roofline_fraction_outside_0_to_1_is_refused_with_what_to_give(appliance, home):
    result = appliance("optimize", str(SOFTMAX), "--stop-at-roofline", "95", *FAST)
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "between 0 and 1" in said and "0.95" in said, said
    assert json.loads(appliance("runs", "--json").stdout) == []  # no run made


def test_a_tuner_run_without_a_seed_says_what_to_give(appliance, home):
    result = appliance("optimize", str(BRANCHY), "--proposer", "tune", *FAST)
    said = " ".join(result.output.split())  # the console wraps lines where the path's length puts them
    assert result.exit_code != 0 and "--from FILE" in said and "--proposer llm" in said, said
    assert "could not capture one graph" in said, said  # why torch.compile's kernels are no seed here


def test_a_tuner_run_from_a_kernel_without_tunables_is_refused_at_the_start_with_what_works(appliance, home):
    # A CuPy kernel: no TUNABLES, and no Triton launch whose parameters the tuner could take as tunables.
    result = appliance("optimize", str(REPO / "tests/fixtures/tasks/rowsoftmax.py"), "--from",
                       str(candidate("cupy_softmax")), "--proposer", "tune", *FAST)
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "has none" in said and "leave out --from" in said, said
    assert "--proposer llm" in said and json.loads(appliance("runs", "--json").stdout) == []  # no run made


def test_an_llm_run_with_no_endpoint_fails_at_once_and_is_not_left_created(appliance, home, monkeypatch):
    monkeypatch.delenv("APPLIANCE_LLM_URL", raising=False)
    result = appliance("optimize", str(SOFTMAX), "--proposer", "llm", *FAST)
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "APPLIANCE_LLM_URL" in said, said
    assert [r["status"] for r in json.loads(appliance("runs", "--json").stdout)] == ["failed"]


def test_a_run_with_no_kernel_and_no_llm_starts_from_torch_compiles_own_kernels(appliance, home):
    """A bare KernelBench file, nothing bundled, no LLM: the seed is Inductor's Triton kernels written out (one graph
    per timed shape), it passes the gate as its own kernels, and the tuner moves among Inductor's launch
    configurations."""
    # Named like a bundled task, but not in the suite: the bundled softmax baseline is not its seed.
    task = home.parent / "softmax.py"
    task.write_text((REPO / "tests/fixtures/bare/rowsoftmax.py").read_text())
    code, summary = optimize(appliance, str(task), "--proposer", "tune",
                             "--max-candidates", "2", "--batch", "1", "--islands", "1")
    assert code == 0, summary
    assert summary["seed"]["proposer"] == "compile" and summary["seed"]["verdict"] == "pass", summary
    (seed_source, note), *tuned = rows(home, "SELECT source, note FROM candidate ORDER BY id")
    assert "class ModelNew(Model)" in seed_source and "@triton.jit" in seed_source and "TUNABLES" in seed_source
    assert "torch.compile's own kernels" in note and "shapes main)" in note, note  # (derived: drawn per evaluation)
    assert "extern_kernels." not in seed_source.split("class extern_kernels")[-1]  # no library call in a graph
    (launches,) = rows(home, "SELECT details FROM evaluation ORDER BY id LIMIT 1")[0]
    assert json.loads(launches)["evidence"]["launches_per_call"] >= 1  # its own kernels ran at the main shape
    # The derived sizes are drawn for each evaluation, so the graphs captured at the rules' sizes never match them:
    # there the seed runs the task's Model, recorded and allowed (correctness only, no speed claimed there).
    provenance = json.loads(launches)["provenance"]
    assert provenance["untimed_calls"] > 0 and provenance["untimed_ops"], provenance
    assert tuned and "_CONFIG" in tuned[0][1], tuned  # the tuner chose another of Inductor's configs


ROWSOFTMAX = REPO / "tests/fixtures/tasks/rowsoftmax.py"


def timed_by_shape(source: str) -> Outcome:
    """The fixture shape_tuned.py's times, replayed from its settings: one launch a call where FOR_WIDE suits the rows
    (wide: over 48), REPEATS (8) where it does not; each shape recorded as the referee records it."""
    constants, table = current_values(source), read_per_shape(source) or {}
    shapes, timings = [], []
    for shape in load_task(ROWSOFTMAX).shapes("small"):
        dims = (shape.sizes["batch_size"], shape.sizes["dim"])
        suits = (constants | table.get(dims, {}))["FOR_WIDE"] == (dims[1] > 48)
        shapes.append({"name": shape.name, "sizes": shape.sizes, "input_shapes": [list(dims)]})
        timings.append({"shape": shape.name, "implementation": "candidate", "device": "cpu",
                        "median_ms": 0.1 if suits else 0.8})
    return Outcome(verdict="pass", stage="done", reason="", jailed=True, device="cpu", mode="small",
                   speedup_vs_eager=0.1 / timings[0]["median_ms"], timings=timings, details={"shapes": shapes})


def test_the_tuner_gives_each_shape_the_settings_that_were_fastest_there(tmp_path):
    # The fixture's one tunable suits either wide rows (the main shape, 64 wide) or narrow ones (the task's other
    # shapes, 37 and 1 wide): neither value is best everywhere, a per-shape table is. Times replayed (timed_by_shape):
    # what the tuner and the loop make of them is under test.
    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    task = load_task(ROWSOFTMAX)
    task_id = store.get_or_add_task(task.name, str(task.path), task.source, task.manifest_text).id
    cfg = OptimizeConfig(device="cpu", timing_budget_s=0.05, max_candidates=3, batch=1, islands=1)
    run_id = store.add_run(task_id, "optimize", config_dict(cfg)).id
    store.add_candidate(run_id, task_id, (REPO / "tests/fixtures/candidates/shape_tuned.py").read_text(),
                        proposer="seed", status="queued", island=0, generation=0)
    summary = Optimizer(store, run_id, task, [ReplayEvaluator(decide=timed_by_shape, slots=1)],
                        [TuneProposer(random.Random(0))], cfg, tmp_path / "work").run()
    assert summary.status == "finished" and summary.passed == 3, summary
    seed, move, composed = [(c.note, c.source) for c, _ in store.run_candidates(run_id)]
    assert move[0] == "FOR_WIDE True->False"
    assert composed[0].startswith("per shape: (1, 1): FOR_WIDE False") and "(3, 37): FOR_WIDE False" in composed[0]
    assert "TUNED_BY_SHAPE = {\n    (1, 1): {'FOR_WIDE': False},\n    (3, 37): {'FOR_WIDE': False},\n}" in composed[1]
    assert "FOR_WIDE = True" in composed[1]  # the main shape keeps the setting that was fastest there


# `python -m appliance`, its evaluations replayed (each a pass, after a moment): the terminal test needs a process.
REPLAYED_APPLIANCE = """
import sys, time
from appliance import executors
from appliance.cli import app
from appliance.evaluation.replay import ReplayEvaluator
from tests.search.test_loop_faults import passes

def decide(source):
    time.sleep(0.3)
    return passes(source)

executors.pipelines = lambda *args, **kwargs: [ReplayEvaluator(decide=decide, slots=1)]
app(sys.argv[1:], prog_name="appliance")
"""


def test_optimize_in_a_terminal_shows_a_live_line(home):
    """In a terminal, a line under the log says what the run is at: evaluated, in flight, best, budget left.
    (Verdicts replayed: the real command, in a real terminal, is under test.)"""
    code, screen = run_in_terminal([sys.executable, "-c", REPLAYED_APPLIANCE, "optimize", str(SOFTMAX),
                                    "--max-candidates", "2", *FAST], timeout_s=240)
    assert code == 0, screen[-2000:]
    assert b"in flight, best " in screen and b"of 2 evaluations" in screen, screen[-2000:]
