"""Human review on the CPU against a real run (tests/tui/conftest.py): approvals (who, when, why), export (patch,
drop-in module, Markdown and self-contained HTML report) and recheck (real re-evaluations, regressions flagged)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys

from appliance.db.models import Timing
from appliance.recheck import compare_timings
from appliance.review import current_user, winner
from tests.tui.conftest import SOFTMAX, cli, db, real_run, store  # noqa: F401 - fixtures

FAST = ("--device", "cpu", "--timing-budget", "0.05")


def sql(url: str, query: str, *args) -> list[tuple]:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
        return connection.execute(query, args).fetchall()


def failed_candidate(store) -> int:
    return next(c.id for c, e in store.run_candidates(1) if e and e.verdict == "compile_error")


def test_approve_and_reject_record_who_when_why_and_the_latest_decision_counts(db, store):
    best = winner(store, 1)
    assert best is not None and not best.approved  # the best candidate, waiting for a person

    assert cli("approve", best.candidate.id, "--comment", "diff reviewed").exit_code == 0
    assert winner(store, 1).approved and winner(store, 1).approval.who == current_user()
    refused = cli("approve", failed_candidate(store), "--comment", "ship it")
    assert refused.exit_code == 2 and "cannot be approved: compile_error" in refused.stderr
    assert cli("reject", best.candidate.id, "--comment", "").exit_code == 2  # why is required

    assert cli("reject", best.candidate.id, "--comment", "too risky", "--who", "bob").exit_code == 0
    assert not winner(store, 1).approved  # rejected after its approval: no approved winner any more
    listed = json.loads(cli("approvals", "1", "--json").stdout)
    assert [(a["decision"], a["who"], a["comment"]) for a in listed] == [
        ("approve", current_user(), "diff reviewed"), ("reject", "bob", "too risky")]
    assert all(a["created_at"] for a in listed)


def test_export_writes_a_patch_a_drop_in_module_and_reports_with_the_evidence(db, store, tmp_path):
    best = winner(store, 1)
    out = tmp_path / "out"
    result = cli("export", "1", "--out", out, "--json")
    assert result.exit_code == 0, result.stdout
    exported = json.loads(result.stdout)
    assert exported["candidate_id"] == best.candidate.id and exported["approved"] is False
    report = (out / "report.md").read_text()
    assert "NOT APPROVED" in report

    # The patch drops in: it adds the winner, exactly as evaluated, and the task module keeps working with the
    # winner in Model's place (inputs, sizes and helpers as they were; the reference as ReferenceModel).
    work = tmp_path / "apply"
    work.mkdir()
    shutil.copy(SOFTMAX, work / "softmax.py")
    subprocess.run(["patch", "-p1", "-s", "-i", str(out / "softmax.patch")], cwd=work, check=True)
    assert (work / "softmax_optimized.py").read_text() == (out / "softmax_optimized.py").read_text() \
        == best.candidate.source
    check = ("import sys, torch; sys.path.insert(0, '.'); import softmax as t; t.batch_size, t.dim = 3, 37; "
             "torch.manual_seed(0); x = t.get_inputs(); m = t.Model(*t.get_init_inputs()); "
             "r = t.ReferenceModel(*t.get_init_inputs()); "
             "assert type(m).__name__ == 'ModelNew', type(m); "
             "torch.testing.assert_close(m(*x), r(*x)); print('drop-in ok')")
    ran = subprocess.run([sys.executable, "-c", check], cwd=work, capture_output=True, text=True,
                         env=os.environ | {"TRITON_INTERPRET": "1"}, timeout=120)
    assert "drop-in ok" in ran.stdout, ran.stderr[-2000:]

    cli("approve", best.candidate.id, "--comment", "numbers hold on every shape")
    assert json.loads(cli("export", "1", "--out", out, "--json").stdout)["approved"] is True
    report = (out / "report.md").read_text()
    env = best.evaluation.environment
    for expected in (f"APPROVED by {current_user()}", "numbers hold on every shape",  # the approval record
                     env["torch"], env["triton"], env["python"], "cpu (small sizes)",  # hardware and versions
                     "| float32 | atol 1e-08, rtol 0.0001 (manifest) |", "seeds 0..2",  # tolerances and seeds
                     "| main | batch_size=4, dim=300 | candidate |", "IQR ms",  # timings with spread
                     "| timed_output_mismatch |", "| impossible |", "not on CPU",  # gate checks
                     "```diff", "speedup.svg", "convergence.svg", "roofline.svg"):
        assert expected in report, expected
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 3 and "<script" not in page and "src=" not in page and "href=" not in page
    assert "numbers hold on every shape" in page and "<table>" in page
    assert json.loads((out / "evaluation.json").read_text())["id"] == best.evaluation.id


def test_export_of_a_run_without_a_passing_candidate_fails_clearly(db, store):
    run = store.add_run(1, "optimize", {})
    result = cli("export", run.id)
    assert result.exit_code == 2 and "no candidate that passed" in result.stderr


def test_recheck_reevaluates_approved_winners_and_flags_the_slower_one(db, store):
    passing = [c.id for c, e in store.run_candidates(1) if e and e.verdict == "pass"][:2]
    for candidate_id in passing:
        cli("approve", candidate_id, "--comment", "ok")
    # The approved numbers, as if measured on another day: one impossibly fast (the recheck is then far slower
    # than its noise), one slow (the recheck is faster: no regression).
    fast, slow = passing
    for candidate_id, median in ((fast, 1e-4), (slow, 1e4)):
        sql(db, "UPDATE timing SET median_ms = ?, iqr_ms = 0 WHERE implementation = 'candidate' AND evaluation_id = "
                "(SELECT id FROM evaluation WHERE candidate_id = ?)", median, candidate_id)
    runs_before = len(store.run_candidates(1))

    result = cli("recheck", "--json", *FAST)
    results = {r["candidate_id"]: r for r in json.loads(result.stdout)}
    assert result.exit_code == 1 and set(results) == set(passing)
    assert results[fast]["regressed"] and "slower beyond the noise" in results[fast]["reason"]
    assert not results[slow]["regressed"] and results[slow]["verdict"] == "pass"

    # Stored: a recheck run with a copy of each candidate, linked to its approval; run 1 itself is unchanged.
    assert len(store.run_candidates(1)) == runs_before
    rechecks = store.rechecks()
    assert {(r.candidate_id, r.regressed) for r in rechecks} == {(fast, True), (slow, False)}
    for r in rechecks:
        evaluation, _ = store.get_evaluation(r.evaluation_id)
        copy = store.get_candidate(evaluation.candidate_id)
        assert copy.parent_id == r.candidate_id and store.get_run(copy.run_id).kind == "recheck"


def test_recheck_flags_a_winner_that_fails_the_gate_now(db, store):
    best = winner(store, 1).candidate.id
    cli("approve", best, "--comment", "ok")
    # The stored task is what gets rechecked: with no tolerance at all, float32 can no longer match float64.
    manifest = sql(db, "SELECT manifest FROM task WHERE id = 1")[0][0]
    sql(db, "UPDATE task SET manifest = ? WHERE id = 1",
        manifest.replace("atol = 1e-8\nrtol = 1e-4", "atol = 0.0\nrtol = 0.0"))
    result = cli("recheck", "1", *FAST)
    assert result.exit_code == 1 and "REGRESSION" in result.stdout
    [recheck] = store.rechecks(best)
    assert recheck.regressed and recheck.reason.startswith("fails the gate now: wrong_output")


def test_the_review_commands_are_there_with_help():
    listing = cli("--help").stdout
    assert all(name in listing for name in ("tui", "approve", "reject", "approvals", "export", "recheck"))


def test_recheck_with_nothing_approved_says_so(db):
    result = cli("recheck", *FAST)
    assert result.exit_code == 0 and "no approved winners" in result.stdout


def timing(shape: str, median: float, iqr: float, implementation: str = "candidate") -> Timing:
    return Timing(evaluation_id=0, shape=shape, implementation=implementation, device="cuda", median_ms=median,
                  iqr_ms=iqr)


def test_the_noise_is_the_trusted_servers_spread_not_the_candidates():
    """An attacker's review: a kernel server that stalls a third of its timed batches leaves its median where it
    is and widens its own IQR at will; taken as the noise, that hid a 5 -> 8 ms regression. The trusted servers'
    relative IQR at the shape, before and now, is the noise where they were timed."""
    quiet = [timing("main", 2.0, 0.01, "eager"), timing("main", 1.5, 0.01, "compile")]
    regressed, why = compare_timings([timing("main", 5.0, 0.02), *quiet], [timing("main", 8.0, 27.8), *quiet])
    assert regressed and "slower beyond the noise" in why
    # A loaded host widens the trusted servers' spread too, and then the candidate's change is within it.
    loaded = [timing("main", 2.0, 0.8, "eager")]
    assert compare_timings([timing("main", 5.0, 0.02), *quiet], [timing("main", 6.0, 0.02), *loaded])[0] is False
    assert compare_timings([timing("main", 5.0, 0.02), *quiet], [timing("main", 6.0, 0.02), *quiet])[0] is True


def test_slower_means_beyond_three_iqrs_and_five_percent_and_always_beyond_twice_the_median():
    before = [timing("main", 1.0, 0.01), timing("edge", 0.1, 0.001)]
    assert compare_timings(before, [timing("main", 1.02, 0.01), timing("edge", 0.1, 0.001)])[0] is False  # noise
    assert compare_timings(before, [timing("main", 1.04, 0.001), timing("edge", 0.1, 0.001)])[0] is False  # < 5%
    assert compare_timings([timing("main", 1.0, 0.1)], [timing("main", 1.2, 0.1)])[0] is False  # within 3 IQRs
    # An IQR as wide as the median (a loaded host) hides no more than a doubling
    assert compare_timings([timing("main", 1.0, 0.0)], [timing("main", 1.9, 0.9)])[0] is False
    assert compare_timings([timing("main", 1e-4, 0.0)], [timing("main", 0.3, 0.2)])[0] is True
    regressed, why = compare_timings(before, [timing("main", 1.0, 0.01), timing("edge", 0.2, 0.001)])
    assert regressed and why.startswith("slower beyond the noise at edge: 0.1 ms -> 0.2 ms (+100.0%)")
