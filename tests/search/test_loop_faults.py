"""The loop when workers fail (not candidates), and budgets changed while a run goes on. Real SQLite; where the loop
is under test, verdicts are replayed (appliance/evaluation/replay.py: no jail, no kernel) and the failing worker is a
replaying one whose host 'breaks' on cue. The compile-only check's tests run the real jailed check."""

from __future__ import annotations

import json

import pytest

from appliance.db import Store
from appliance.errors import InfrastructureError
from appliance.evaluation.pipeline import EvalSettings, Outcome, Pipeline
from appliance.evaluation.replay import ReplayEvaluator
from appliance.search.loop import OptimizeConfig, Optimizer, config_dict
from appliance.tasks import load_task
from sandbox.jail import Jail
from tests.conftest import REPO

SOFTMAX = REPO / "benchmarks/tasks/softmax.py"


def passes(source: str) -> Outcome:
    """The replayed verdict of every candidate here: it passes, as a CPU evaluation does (one timed shape)."""
    return Outcome(verdict="pass", stage="done", reason="", jailed=True, device="cpu", mode="small",
                   speedup_vs_eager=1.25, timings=[{"shape": "main", "implementation": "candidate", "device": "cpu",
                                                    "median_ms": 0.8}])


class BreakingWorker(ReplayEvaluator):
    """A worker on a host that fails (as a lost worker does) for the candidates listed, the number of times given;
    the others pass."""

    def __init__(self, fail_sources: dict[str, int], slots: int = 1):
        super().__init__(decide=passes, slots=slots)
        self.fail_sources = fail_sources

    def evaluate(self, task, candidate_path):
        source = open(candidate_path).read()
        if self.fail_sources.get(source, 0) > 0:
            self.fail_sources[source] -= 1
            raise InfrastructureError("worker lost (test)")
        return super().evaluate(task, candidate_path)


def make_run(tmp_path, seed_source: str | None = None, **config) -> tuple[Store, int, OptimizeConfig, str]:
    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    task = load_task(SOFTMAX)
    row = store.get_or_add_task(task.name, str(task.path), task.source, task.manifest_text)
    cfg = OptimizeConfig(device="cpu", timing_budget_s=0.05, **config)
    run = store.add_run(row.id, "optimize", config_dict(cfg))
    seed = seed_source or (REPO / "benchmarks/baselines/softmax.py").read_text()
    store.add_candidate(run.id, row.id, seed, proposer="seed", status="queued", island=0, generation=0)
    return store, run.id, cfg, seed


def optimizer(store, run_id, cfg, tmp_path, pipeline, proposer=None) -> Optimizer:
    from appliance.proposers.tune import TuneProposer
    import random

    return Optimizer(store, run_id, load_task(SOFTMAX), [pipeline], [proposer or TuneProposer(random.Random(0))], cfg,
                     tmp_path / "work")


def settings(tmp_path) -> EvalSettings:
    return EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=0.05, jobs_dir=tmp_path,
                        reuse_inputs=True)


def test_a_lost_worker_costs_one_requeue_then_an_infrastructure_failure_and_the_run_goes_on(tmp_path):
    store, run_id, cfg, seed = make_run(tmp_path, max_candidates=3)
    first_child = {}

    class FailFirstChild(BreakingWorker):
        def evaluate(self, task, candidate_path):
            source = open(candidate_path).read()
            if source != seed and not first_child:
                first_child["source"] = source
                self.fail_sources[source] = 2  # lost twice: re-queued once, then recorded
            return super().evaluate(task, candidate_path)

    # Two slots: with one, a candidate lost twice in a row cannot be told from a broken host (next test).
    summary = optimizer(store, run_id, cfg, tmp_path, FailFirstChild({}, slots=2)).run()
    assert summary.status == "finished" and summary.evaluated == 3
    rows = store.run_candidates(run_id)
    failed = [(c, e) for c, e in rows if e is not None and e.verdict == "infrastructure_failure"]
    assert len(failed) == 1 and failed[0][0].source == first_child["source"]
    assert "not the candidate's fault" in failed[0][1].reason
    assert sum(1 for _, e in rows if e is not None and e.verdict == "pass") == 2  # the run carried on
    assert failed[0][0].id in store.get_run(run_id).state["requeued_after_infrastructure_failure"]


def test_a_host_that_fails_every_evaluation_stops_the_run_with_the_error(tmp_path):
    store, run_id, cfg, seed = make_run(tmp_path, max_candidates=3)
    pipeline = BreakingWorker({seed: 100})
    with pytest.raises(InfrastructureError, match="worker lost"):
        optimizer(store, run_id, cfg, tmp_path, pipeline).run()
    (cand, evaluation), = store.run_candidates(run_id)
    assert cand.status == "queued" and evaluation is None  # nothing blamed on it; --resume evaluates it


def test_a_budget_lowered_in_the_database_applies_to_the_run_in_progress(tmp_path):
    store, run_id, cfg, _ = make_run(tmp_path, max_candidates=50)
    store.update_run(run_id, config=config_dict(cfg) | {"max_candidates": 2})  # e.g. from the TUI
    summary = optimizer(store, run_id, cfg, tmp_path, ReplayEvaluator(decide=passes, slots=2)).run()
    assert summary.status == "finished" and summary.evaluated == 2
    assert json.loads(json.dumps(store.get_run(run_id).config))["max_candidates"] == 2


def test_every_worker_prepares_the_task_when_the_run_starts_not_when_its_first_candidate_comes(tmp_path):
    """With one candidate and two workers, the idle worker has the inputs ready all the same. (That a pipeline
    keeps what it prepared for its later candidates: test_optimize.py's tuner run, `wall_s.prepare`.)"""
    store, run_id, cfg, _ = make_run(tmp_path, max_candidates=1)
    kept_at_close = []

    class Watched(ReplayEvaluator):
        def __init__(self):
            super().__init__(decide=passes, slots=1)
            self.prepared = []

        def prepare(self, task):
            self.prepared.append(task.name)

        def close(self):
            kept_at_close.append(len(self.prepared))

    pipelines = [Watched() for _ in range(2)]
    from appliance.proposers.tune import TuneProposer
    import random

    summary = Optimizer(store, run_id, load_task(SOFTMAX), pipelines, [TuneProposer(random.Random(0))], cfg,
                        tmp_path / "work").run()
    assert summary.evaluated == 1 and [len(p.evaluated) for p in pipelines] == [1, 0]  # one of them idled
    assert kept_at_close == [1, 1]


def test_two_controllers_cannot_claim_the_same_run(tmp_path):
    store, run_id, _, _ = make_run(tmp_path)
    store.update_run(run_id, status="queued")
    other = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    assert store.claim_run(run_id) is True
    assert other.claim_run(run_id) is False and other.get_run(run_id).status == "running"


def test_a_new_controller_requeues_only_runs_whose_controller_is_gone(tmp_path):
    import socket
    import subprocess

    from appliance.controller import requeue_orphaned_runs

    store, dead_run, _, _ = make_run(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer exists
    runs = {"dead": dead_run}
    for name in ("alive", "elsewhere", "terminal"):
        runs[name] = make_run(tmp_path)[1]
    owners = {"dead": f"{socket.gethostname()}:{dead.pid}", "alive": f"{socket.gethostname()}:1",
              "elsewhere": "another-host:12345", "terminal": None}
    for name, run_id in runs.items():
        config = store.get_run(run_id).config | ({"controller": True} if owners[name] else {})
        store.update_run(run_id, status="running", config=config,
                         state={"controller": owners[name]} if owners[name] else {})
    assert requeue_orphaned_runs(store) == [runs["dead"]]
    assert {n: store.get_run(r).status for n, r in runs.items()} == {
        "dead": "queued", "alive": "running", "elsewhere": "running", "terminal": "running"}


def test_a_run_whose_controller_on_another_host_stopped_beating_goes_back_to_the_queue(tmp_path):
    import time

    from appliance.controller import requeue_orphaned_runs

    store, _, cfg, _ = make_run(tmp_path, max_candidates=1)
    runs = {name: make_run(tmp_path, max_candidates=1)[1] for name in ("beating", "silent")}
    for name, run_id in runs.items():
        store.update_run(run_id, status="running", config=store.get_run(run_id).config | {"controller": True},
                         state={"controller": "another-host:12345",
                                "heartbeat": time.time() - (5 if name == "beating" else 3600)})
    assert requeue_orphaned_runs(store, stale_s=600) == [runs["silent"]]
    assert store.get_run(runs["beating"]).status == "running"

    # The loop beats the heartbeat as it runs.
    summary = optimizer(store, runs["silent"], cfg, tmp_path, ReplayEvaluator(decide=passes)).run()
    assert summary.evaluated == 1
    assert time.time() - store.get_run(runs["silent"]).state["heartbeat"] < 60


class ProfileReadingTuner:
    """A proposer that, like the LLM's, reads the Nsight Compute summary (the tuner's moves, no network)."""
    from appliance.proposers.base import Traits

    name = "tune"
    traits = Traits(reads_profiles=True, avoids_seen=True, starts_on_pending_seed=True, needs_no_screen=True)

    def __init__(self):
        import random

        from appliance.proposers.tune import TuneProposer

        self.inner = TuneProposer(random.Random(0))

    def propose(self, ctx, n, seen=None):
        return self.inner.propose(ctx, n, seen)


def test_a_new_best_is_profiled_only_past_the_gain_threshold_which_remote_workers_receive(tmp_path):
    from appliance.search.loop import PROFILE_MIN_GAIN, ProfileNewBests

    store, run_id, cfg, _ = make_run(tmp_path, max_candidates=1)
    pipeline = ReplayEvaluator(decide=passes)
    opt = optimizer(store, run_id, cfg, tmp_path, pipeline, ProfileReadingTuner())
    policy = pipeline.profile_if
    assert isinstance(policy, ProfileNewBests)
    assert policy.threshold() == 0.0 and policy(1.01) and not policy(None)  # nothing evaluated yet: any speedup
    opt.run()
    best = opt.summary().best["speedup_vs_eager"]
    assert policy.threshold() == pytest.approx(PROFILE_MIN_GAIN * best)
    assert policy(best * (PROFILE_MIN_GAIN + 0.01)) and not policy(best * 1.01)


def test_a_run_whose_proposer_reads_no_profiles_profiles_nothing_and_tells_remote_workers_so(tmp_path):
    store, run_id, cfg, _ = make_run(tmp_path, max_candidates=1)
    pipeline = Pipeline(Jail(), settings(tmp_path))
    optimizer(store, run_id, cfg, tmp_path, pipeline)  # the tuner
    assert pipeline.profile_if.threshold() == float("inf") and not pipeline.profile_if(1e6)


def test_a_remote_worker_does_not_profile_what_its_own_earlier_profiles_already_beat():
    """Worker processes and Ray actors get the threshold with the evaluation (pipeline.SentThreshold), and it may be
    stale when it is used: they also ask for a margin over what they profiled since."""
    from appliance.evaluation.pipeline import SentThreshold
    from appliance.search.loop import PROFILE_MIN_GAIN

    profile_if = SentThreshold()

    def decide(speedup, above):
        profile_if.set(above)
        return profile_if(speedup)

    assert decide(2.0, 1.5)  # beats the controller's threshold
    assert not decide(2.0 * (PROFILE_MIN_GAIN - 0.01), 1.5)  # ... and so did the first, by too little since
    assert decide(2.0 * (PROFILE_MIN_GAIN + 0.01), 1.5)
    assert not decide(10.0, float("inf"))  # the controller's proposer reads no profiles
    assert not decide(None, 0.0)
    assert decide(None, None)  # sent without a threshold (a plain evaluation): profile as the settings say


def test_what_a_worker_profiled_for_one_task_does_not_raise_the_bar_for_another():
    """A worker serves many runs: a 10x best profiled on one task must not stop another task's 2x new best (its
    run's own threshold, 1.5x) from being profiled."""
    from appliance.evaluation.pipeline import SentThreshold

    profile_if = SentThreshold()
    softmax, rmsnorm = {"source": "softmax", "manifest": ""}, {"source": "rmsnorm", "manifest": ""}
    profile_if.set(1.5, softmax)
    assert profile_if(10.0)
    profile_if.set(1.5, rmsnorm)
    assert profile_if(2.0)
    profile_if.set(1.5, softmax)
    assert not profile_if(2.0)  # the same task: its worker's own profiled best still counts


def test_the_tuner_asked_for_two_parents_in_one_generation_does_not_propose_the_same_source_twice(tmp_path):
    """Parents are asked one after another, each told what the others proposed; a duplicate would be dropped and
    the generation would come out one candidate short."""
    from appliance.proposers.base import Proposal
    from appliance.proposers.edits import source_hash

    store, run_id, cfg, seed = make_run(tmp_path, max_candidates=10, islands=2, batch=2, exploit=1.0)
    task_id = store.get_run(run_id).task_id
    for c, _ in store.run_candidates(run_id):
        store.add_evaluation(c.id, run_id, verdict="pass", stage="done", jailed=True, device="cpu", mode="small",
                             speedup_vs_eager=1.0)
    for island, speedup in ((0, 1.5), (1, 1.2)):  # each island's best: two parents
        c = store.add_candidate(run_id, task_id, seed + f"\nVARIANT = {island}\n", proposer="tune", status="queued",
                                island=island, generation=0)
        store.add_evaluation(c.id, run_id, verdict="pass", stage="done", jailed=True, device="cpu", mode="small",
                             speedup_vs_eager=speedup)

    class SameSettingsForEveryParent:  # as per-shape settings composed from one family are
        from appliance.proposers.tune import TuneProposer

        name, traits = "tune", TuneProposer.traits

        def __init__(self):
            self.parents = []

        def propose(self, ctx, n, seen=None):
            self.parents.append(ctx.parent.source)
            first, second = seed + "\nTUNED = 1\n", seed + "\nTUNED = 2\n"
            return [Proposal(source=first if source_hash(first) not in seen else second, proposer="tune")]

    proposer = SameSettingsForEveryParent()
    opt = Optimizer(store, run_id, load_task(SOFTMAX), [Pipeline(Jail(), settings(tmp_path))], [proposer], cfg,
                    tmp_path / "work")
    assert opt._propose_generation(2)
    assert len(set(proposer.parents)) == 2, proposer.parents
    queued = [c.source for c, _ in store.run_candidates(run_id) if c.status == "queued"]
    assert sorted(queued) == sorted([seed + "\nTUNED = 1\n", seed + "\nTUNED = 2\n"])
    assert opt.state.get("duplicates", 0) == 0


class CountingScreen:
    """A real CompileScreen (jailed, Triton's compiler for sm_90), counting what it is asked to check."""

    def __init__(self, jobs):
        from appliance.evaluation.compile_screen import CompileScreen

        self.inner, self.slots, self.checked = CompileScreen(Jail(), jobs, arch=90), 1, []

    def screen(self, task, path, display_path=None):
        self.checked.append(path.read_text())
        return self.inner.screen(task, path, display_path)


def test_a_kernel_that_only_the_interpreter_runs_is_rejected_by_the_compile_check_before_any_evaluation(tmp_path):
    """The Triton interpreter runs Python as Python: on the CPU this candidate passes the gate. Built for the GPU,
    its `break` does not compile: the compile-only check (what CPU-only nodes of a cluster do) says so first."""
    source = (REPO / "tests/fixtures/candidates/builds_only_in_the_interpreter.py").read_text()
    store, run_id, cfg, _ = make_run(tmp_path, max_candidates=1)
    seed = store.run_candidates(run_id)[0][0]
    store.add_candidate(run_id, store.get_run(run_id).task_id, source, proposer="llm", status="queued", island=0,
                        generation=0)
    store.set_candidate_status(seed.id, "evaluated")  # only the LLM's candidate is left to evaluate

    def no_evaluation(source):
        raise AssertionError("the GPU pipeline was given a candidate the compile check rejects")

    screen = CountingScreen(tmp_path / "screen")
    opt = Optimizer(store, run_id, load_task(SOFTMAX), [ReplayEvaluator(decide=no_evaluation)],
                    [ProfileReadingTuner()], cfg, tmp_path / "work", screens=[screen])
    assert opt.run().evaluated == 1
    (cand, evaluation), = [(c, e) for c, e in store.run_candidates(run_id) if c.proposer == "llm"]
    assert (evaluation.verdict, evaluation.stage) == ("compile_error", "compile")
    assert "does not build for sm_90" in evaluation.reason and "break" in evaluation.reason.lower()
    assert evaluation.details["screen"]["arch"] == 90 and screen.checked == [source]

    # On the CPU alone (the interpreter), the same candidate passes: only the GPU build finds it.
    path = tmp_path / "candidate.py"
    path.write_text(source)
    assert Pipeline(Jail(), settings(tmp_path)).evaluate(load_task(SOFTMAX), path).verdict == "pass"


def test_the_compile_check_lets_a_kernel_that_builds_through_and_skips_the_tuners_settings(tmp_path):
    """The real check, on the seed; what is let through is evaluated (replayed: what the pipeline makes of it is
    not under test here)."""
    store, run_id, cfg, seed = make_run(tmp_path, max_candidates=3)
    screen = CountingScreen(tmp_path / "screen")
    opt = Optimizer(store, run_id, load_task(SOFTMAX), [ReplayEvaluator(decide=passes)],
                    [ProfileReadingTuner()], cfg, tmp_path / "work", screens=[screen])
    assert opt.run().evaluated == 3
    verdicts = {c.proposer: e.verdict for c, e in store.run_candidates(run_id)}
    assert verdicts == {"seed": "pass", "tune": "pass"}, verdicts
    assert screen.checked == [seed]  # the seed was checked; the tuner's settings of it were not


def test_with_slow_screens_the_loop_neither_overshoots_its_budget_nor_piles_up_proposals(tmp_path):
    """Candidates waiting for a compile check count against the free slots and the candidate budget: the loop does
    not keep proposing while they wait, and screen rejections do not take the run past --max-candidates."""
    import itertools
    import random
    import threading
    import time
    from types import SimpleNamespace

    from appliance.evaluation.pipeline import Outcome
    from appliance.proposers.base import Proposal

    class LikeAnLLM:  # a new source every time, from a proposer whose candidates are screened
        from appliance.proposers.llm import LLMProposer

        name, traits = "llm", LLMProposer.traits

        def __init__(self, seed):
            self.seed, self.asked = seed, itertools.count()

        def propose(self, ctx, n, seen=None):
            return [Proposal(source=self.seed + f"\nVARIANT = {next(self.asked)}\n", proposer="llm") for _ in range(n)]

    class QuickPipeline:
        slots, profile_if = 4, None
        gpu = None

        def prepare(self, task):
            pass

        def close(self):
            pass

        def evaluate(self, task, path):
            time.sleep(0.05)
            return Outcome(verdict="pass", stage="done", reason="", jailed=True, device="cpu", mode="small",
                           speedup_vs_eager=1.0 + random.random())

    class SlowScreen:
        slots = 1

        def __init__(self):
            self.turn, self.lock = itertools.count(), threading.Lock()

        def screen(self, task, path, display_path=None):
            time.sleep(0.3)
            with self.lock:
                reject = next(self.turn) % 2 == 1
            return Outcome(verdict="compile_error", stage="compile", reason="refused", jailed=True, device="cpu",
                           mode="full") if reject else None

    store, run_id, cfg, seed = make_run(tmp_path, max_candidates=12, batch=2)
    proposer = LikeAnLLM(seed)
    opt = Optimizer(store, run_id, load_task(SOFTMAX), [QuickPipeline()], [proposer], cfg, tmp_path / "work",
                    screens=[SlowScreen()])
    assert opt.run().evaluated == 12  # not 13: rejections count, and screens start only while there is room
    verdicts = [e.verdict for _, e in store.run_candidates(run_id) if e is not None]
    assert "compile_error" in verdicts and "pass" in verdicts
    left = [c for c, e in store.run_candidates(run_id) if e is None and c.status == "queued"]
    assert len(left) <= QuickPipeline.slots + cfg.batch, (len(left), proposer.asked)  # was 55 left, of 74


def test_the_tuner_fills_free_slots_from_a_seed_still_evaluating_and_a_failing_seed_ends_the_run_cleanly(tmp_path):
    """The first generation builds on the seed before its verdict (other slots do not idle through it). When the
    seed then fails the gate, what was proposed from it is still evaluated (with its own verdict), and the run
    finishes for want of a parent instead of crashing or proposing from a failed kernel."""
    honest = (REPO / "benchmarks/baselines/softmax.py").read_text()
    broken = honest.replace("tl.store(y_row + cols, y.to(", "tl.store(y_row + cols, (2 * y).to(")
    assert broken != honest

    def gate(source: str) -> Outcome:  # (replayed) the doubled output fails the correctness check, as it would
        if "(2 * y)" not in source:
            return passes(source)
        return Outcome(verdict="wrong_output", stage="correctness", reason="max abs err 0.5 > tol", jailed=True,
                       device="cpu", mode="small")

    store, run_id, cfg, _ = make_run(tmp_path, seed_source=broken, max_candidates=10, batch=1)
    (seed_row, _), = store.run_candidates(run_id)
    summary = optimizer(store, run_id, cfg, tmp_path, ReplayEvaluator(decide=gate, slots=2)).run()
    rows = store.run_candidates(run_id)
    assert summary.status == "finished" and summary.passed == 0
    children = [(c, e) for c, e in rows if c.proposer == "tune"]
    assert len(children) == 1 and children[0][0].parent_id == seed_row.id and children[0][0].generation == 0
    assert all(e is not None and e.verdict == "wrong_output" for _, e in rows), [(c.proposer, e and e.verdict)
                                                                                 for c, e in rows]


class TimeUpEvaluator:
    """An Evaluator whose evaluations of `waits_for_the_device` sources never get the device until they are called
    off (cancel_unmeasured); the others measure for `measure_s` and pass. The real pipeline's side of this (gate,
    killed processes) is tested in tests/evaluation/test_pipeline.py."""

    def __init__(self, waits_for_the_device: set[str], measure_s: float):
        import threading

        self.waits, self.measure_s, self.slots, self.gpu, self.profile_if = waits_for_the_device, measure_s, 4, None, None
        self.called_off = threading.Event()

    def prepare(self, task):
        pass

    def evaluate(self, task, candidate_path):
        import time

        from appliance.errors import EvaluationCancelled
        from appliance.evaluation.pipeline import Outcome

        if open(candidate_path).read() in self.waits:
            if not self.called_off.wait(timeout=60):
                raise AssertionError("never called off")
            raise EvaluationCancelled("called off before it measured")
        time.sleep(self.measure_s)
        return Outcome(verdict="pass", stage="done", reason="ok", jailed=True, device="cpu", mode="small",
                       timings=[{"shape": "main", "implementation": "candidate", "device": "cpu", "median_ms": 1.0,
                                "reps": 10}])

    def cancel_unmeasured(self) -> int:
        self.called_off.set()
        return len(self.waits)

    def close(self):
        pass


def test_when_the_wall_budget_is_spent_evaluations_waiting_for_the_device_go_back_to_the_queue(tmp_path):
    """The run ends near its --max-wall: what measures is recorded, what still waits goes back to the queue for a
    --resume, not awaited (each would wait for the device in turn) and not blamed."""
    import time

    store, run_id, cfg, seed = make_run(tmp_path, max_candidates=10, max_wall_s=1.0)
    task_id = store.get_run(run_id).task_id
    waiting = {f"{seed}\n# waits {i}\n" for i in range(3)}
    for source in sorted(waiting):
        store.add_candidate(run_id, task_id, source, proposer="seed", status="queued", island=0, generation=0)
    evaluator = TimeUpEvaluator(waiting, measure_s=2.0)
    started = time.monotonic()
    summary = optimizer(store, run_id, cfg, tmp_path, evaluator).run()
    assert time.monotonic() - started < 30
    assert summary.status == "finished" and summary.evaluated == 1  # the measuring one, recorded
    rows = store.run_candidates(run_id)
    assert {c.source for c, e in rows if e is not None} == {seed}
    # Queued again, then, the run being finished, marked for a resume (store.close_queue): nothing blamed on them.
    assert {c.source for c, e in rows if c.status == "not_evaluated" and e is None} == waiting
    assert store.requeue_unfinished(run_id) == 3
