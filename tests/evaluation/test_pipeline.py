"""Pipeline properties beyond single verdicts: NaN/Inf semantics, the torch.compile baseline, isolation, budgets."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from tests.conftest import FIXTURES, candidate

LOG_TASK = FIXTURES / "tasks" / "elementwise_log.py"


def test_nan_and_inf_pass_only_where_the_reference_has_them(appliance):
    code, result = appliance.eval_json(LOG_TASK, candidate("log_good"))
    assert code == 0, result["reason"]
    code, result = appliance.eval_json(LOG_TASK, candidate("log_hides_nan"))
    assert code == 1 and result["verdict"] == "nan_inf", result["reason"]
    assert "where the reference differs" in result["reason"]


def test_torch_compile_baseline_is_timed_like_the_candidate(appliance, softmax_task):
    result = appliance("eval", softmax_task, candidate("good"), "--json", "--device", "cpu",
                       "--baselines", "eager,compile", "--timing-budget", "0.05")
    data = __import__("json").loads(result.stdout)
    assert result.exit_code == 0, data
    main = {t["implementation"]: t for t in data["timings"] if t["shape"] == "main"}
    assert set(main) == {"candidate", "eager", "compile"}
    assert main["compile"]["error"] is None and main["compile"]["median_ms"] > 0
    assert main["compile"]["device"] == main["candidate"]["device"] == "cpu"
    assert data["speedup_vs_compile"] == pytest.approx(main["compile"]["median_ms"] / main["candidate"]["median_ms"])


def test_candidate_sees_only_its_own_source(appliance, softmax_task, home):
    code, result = appliance.eval_json(softmax_task, candidate("snoops"))
    assert result["verdict"] == "runtime_error", result["reason"]
    reason = result["reason"]
    assert "SUSPICIOUS []" in reason, reason
    # Its own file is there; no input file (the referee's buffers hold the inputs), no task, no database.
    assert "candidate.py" in reason and ".pt" not in reason.split("VISIBLE", 1)[1], reason
    assert (home / "appliance.db").exists()


def test_the_referee_and_the_server_end_with_the_evaluation_whatever_the_verdict(softmax_task, tmp_path):
    """A passing, a wrong and a crashing candidate: each gets its verdict from the referee's session, the referee says
    where its time went, and no job folder (and so no process) is left behind."""
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from appliance.tasks import load_task
    from sandbox.jail import Jail

    pipeline = Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=0.05,
                                             jobs_dir=tmp_path, reuse_inputs=True))
    task = load_task(softmax_task)
    good = pipeline.evaluate(task, candidate("good"))
    assert good.verdict == "pass", good.reason
    stages = good.details["stage_s"]["referee"]
    assert {"load", "load_candidate", "correctness", "timing"} <= set(stages), stages
    assert stages["cpu_s"] > 0.1  # importing torch alone takes more than a tenth of a second
    assert [c["kind"] for c in good.details["cases"]] == ["pass"] * 6  # 3 shapes x 2 seeds
    bad = pipeline.evaluate(task, candidate("edge_wrong"))
    # Its bug shows only where a row's largest value is small: the checked inputs can miss it (outliers at the odd
    # shape), and then a timed call's check finds it.
    assert bad.verdict in ("wrong_output", "timed_output_mismatch"), bad.reason
    crashed = pipeline.evaluate(task, candidate("raises"))
    assert crashed.verdict == "runtime_error", crashed.reason
    pipeline.close()
    assert not list(tmp_path.glob("eval-*"))


def _pipeline(tmp_path, slots: int):
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from sandbox.jail import Jail

    return Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=0.05,
                                         jobs_dir=tmp_path, reuse_inputs=True), slots=slots)


def _evaluate_at_once(pipeline, task, paths) -> list:
    outcomes = [None] * len(paths)

    def one(i):
        outcomes[i] = pipeline.evaluate(task, paths[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(paths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def _three_good_at_once(pipeline, task_path) -> list:
    """Three honest candidates sent at once (the task prepared first); all must pass."""
    from appliance.tasks import load_task

    task = load_task(task_path)
    pipeline.prepare(task)
    outcomes = _evaluate_at_once(pipeline, task, [candidate("good")] * 3)
    pipeline.close()
    assert [o.verdict for o in outcomes] == ["pass"] * 3, [o.reason for o in outcomes]
    return outcomes


def test_evaluations_in_flight_hold_device_memory_within_the_budget(softmax_task, tmp_path):
    """A budget smaller than any evaluation: every process holding device memory is alone, the others wait."""
    pipeline = _pipeline(tmp_path, slots=3)
    pipeline.gate.memory_bytes = 1
    outcomes = _three_good_at_once(pipeline, softmax_task)
    turns = [o.details["device_turns"] for o in outcomes]
    assert all(t["neighbours"] == 0 for t in turns), turns  # never resident beside another process
    assert sum(t["resident_wait_s"] for t in turns) > 0, turns  # and they did contend
    assert pipeline.gate.residents() == 0


def test_evaluations_start_only_while_their_host_memory_fits(softmax_task, tmp_path):
    """A host-memory budget smaller than one evaluation: they run one after another (the first of them alone), each
    records what it held and waited, and nothing stays held."""
    pipeline = _pipeline(tmp_path, slots=3)
    pipeline.host_memory.total_bytes = 1
    outcomes = _three_good_at_once(pipeline, softmax_task)
    held = sorted((o.details["host_memory"] for o in outcomes), key=lambda h: h["wait_s"])
    assert held[0]["held_gib"] >= 2.0 and held[0]["budget_gib"] == 0.0, held  # two CPU processes at least
    # One after another: the second waited for the first's whole evaluation, the third for both.
    walls = sorted(o.details["wall_s"]["candidate"] for o in outcomes)
    assert held[1]["wait_s"] >= walls[0] * 0.9 and held[2]["wait_s"] >= 2 * walls[0] * 0.9, (held, walls)
    assert pipeline.host_memory.held() == 0


def test_out_of_memory_beside_other_evaluations_is_retried_alone(softmax_task, tmp_path):
    from appliance.tasks import load_task
    from sandbox.gate import TurnRecord

    pipeline = _pipeline(tmp_path, slots=2)
    task = load_task(softmax_task)
    pipeline.prepare(task)
    # Alone on the device, running out of memory is the candidate's own doing: no retry.
    alone = pipeline.evaluate(task, candidate("out_of_memory"))
    assert alone.verdict == "runtime_error" and "OutOfMemoryError" in alone.reason, alone.reason
    assert "retried_alone" not in alone.details and alone.details["device_turns"]["neighbours"] == 0
    # Beside another evaluation holding device memory, it may be the neighbour's doing. The neighbour here is a
    # resident the test holds in the gate itself (real processes' residency: tests/sandbox/test_gate.py), so that
    # it is there for the first try and leaves only once the retry, which asks for the whole device, waits.
    neighbour = TurnRecord()
    pipeline.gate.admit(neighbour, 1)
    outcomes = []
    trying = threading.Thread(target=lambda: outcomes.append(pipeline.evaluate(task, candidate("out_of_memory"))))
    trying.start()
    deadline = time.monotonic() + 120
    while pipeline.gate.waiting() == 0:  # the retry waits to be alone
        assert time.monotonic() < deadline and trying.is_alive(), outcomes and outcomes[0].reason
        time.sleep(0.01)
    time.sleep(0.2)  # seen waiting within a poll: let the wait last long enough to show in its rounded record
    pipeline.gate.leave(neighbour)
    trying.join()
    pipeline.close()
    [beside] = outcomes
    assert "out of memory" in beside.details["retried_alone"], beside.details
    assert beside.verdict == "runtime_error", beside.reason
    assert "also failed with the device to itself" in beside.reason, beside.reason
    assert beside.details["device_turns"]["resident_wait_s"] > 0
    assert beside.details["device_turns"]["neighbours"] >= 1


def test_out_of_memory_for_more_than_the_device_could_give_alone_is_not_retried(softmax_task, tmp_path):
    """The error names 20 GiB; the budget is 16 GiB: alone it would fail the same, so no one waits for the device
    to empty."""
    from appliance.tasks import load_task
    from sandbox.gate import TurnRecord

    pipeline = _pipeline(tmp_path, slots=2)
    pipeline.gate.memory_bytes = 16 << 30
    task = load_task(softmax_task)
    pipeline.prepare(task)
    neighbour = TurnRecord()
    pipeline.gate.admit(neighbour, 1)
    outcomes = []
    trying = threading.Thread(target=lambda: outcomes.append(pipeline.evaluate(task, candidate("out_of_memory"))))
    trying.start()
    waited_to_be_alone = False
    while trying.is_alive() and not waited_to_be_alone:
        waited_to_be_alone = pipeline.gate.waiting() > 0  # a retry alone would wait for the neighbour to leave
        time.sleep(0.01)
    pipeline.gate.leave(neighbour)
    trying.join()
    pipeline.close()
    assert not waited_to_be_alone
    [outcome] = outcomes
    assert outcome.verdict == "runtime_error" and "OutOfMemoryError" in outcome.reason, outcome.reason
    assert outcome.details["device_turns"]["neighbours"] >= 1 and "retried_alone" not in outcome.details


def test_resident_estimate_counts_the_timing_pool_the_outputs_and_the_float64_reference():
    from appliance.evaluation.residency import CHECK_COMPARE_BYTES, PROCESS_ALLOWANCE_BYTES, resident_estimate
    from sandbox.harness.referee import ARENA_SLACK_BYTES, MAX_CALLS_PER_BATCH, TIMING_POOL_BYTES

    small = [{"name": "main", "input_bytes": 1000, "output_bytes": 400}, {"name": "odd", "input_bytes": 10,
                                                                             "output_bytes": 4}]
    pool = MAX_CALLS_PER_BATCH * 1400  # the largest set, as many times as a batch has calls
    fixed = CHECK_COMPARE_BYTES + 2 * PROCESS_ALLOWANCE_BYTES
    private = MAX_CALLS_PER_BATCH * 1000  # the referee's own copy of the batch's inputs
    # CPU: the server's outputs before they are copied, once more the pool; GPU: the arena (outputs twice, and
    # workspace) and the L2 flush buffer.
    assert resident_estimate(small, "cpu") == 2 * pool + private + 4 * 1400 + fixed
    arena = 2 * MAX_CALLS_PER_BATCH * 400 + ARENA_SLACK_BYTES
    assert resident_estimate(small, "cuda") == pool + private + arena + 4 * 1400 + (256 << 20) + fixed
    big = [{"name": "main", "input_bytes": 8 << 30, "output_bytes": 1 << 30}]  # one set past the pool's bound
    assert TIMING_POOL_BYTES["cuda"] < 9 << 30
    assert resident_estimate(big, "cuda") == (9 << 30) + (8 << 30) + (2 << 30) + ARENA_SLACK_BYTES + \
        4 * (9 << 30) + (256 << 20) + fixed


def test_a_check_that_runs_out_of_device_memory_beside_others_is_run_again_alone(tmp_path):
    """The trusted check ran out of device memory while another process was resident (its neighbours' estimates are
    estimates): it is run once more with the device to itself, and the evaluation stands on that run. One that runs
    out alone is the task's error, said as such, not a crash of the run."""
    from appliance.errors import TaskError
    from appliance.tasks import load_task
    from sandbox.gate import TurnRecord

    task = load_task(FIXTURES / "tasks" / "check_out_of_memory.py")
    pipeline = _pipeline(tmp_path, slots=1)
    neighbour = TurnRecord()
    pipeline.gate.admit(neighbour, 1)  # another evaluation's process, resident while the first check runs ...

    def ran_out() -> bool:  # os.walk, not rglob: folders the evaluation removes mid-walk must not end the watch
        return any("ran-out-once" in files for _, _, files in os.walk(tmp_path))

    def leave_once_the_check_ran_out():  # ... so that the retry, which waits for the device to itself, can start
        try:
            deadline = time.monotonic() + 120
            while not ran_out() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:  # whatever happens here, the neighbour leaves: else the retry waits for the device forever
            pipeline.gate.leave(neighbour)

    threading.Thread(target=leave_once_the_check_ran_out, daemon=True).start()
    outcome = pipeline.evaluate(task, candidate("good"))
    assert outcome.verdict == "pass", outcome.reason
    # prepare, and the candidate's referee twice
    assert len(outcome.details["device_turns"]["held_s_by_process"]) == 3, outcome.details["device_turns"]

    always = tmp_path / "always_oom.py"
    always.write_text(task.path.read_text().replace("OOM_ONCE = True", "OOM_ONCE = False"))
    (tmp_path / "always_oom.toml").write_text(task.manifest_path.read_text())
    with pytest.raises(TaskError, match="ran out of device memory with the device to itself"):
        pipeline.evaluate(load_task(always), candidate("good"))
    pipeline.close()





def test_an_evaluation_takes_a_fixed_few_turns(softmax_task, tmp_path):
    """Every turn waits behind the measurements in progress: the referee takes one shared turn per correctness call
    (3 shapes x 2 seeds), one for running the reference at every shape, and per shape a shared one for the first
    call and an exclusive one for timing; the first evaluation is also charged the prepare made ahead (one exclusive process), and shows where its time went.
    Its processes (referee and kernel server) stand still while another evaluation measures, and say for how long."""
    from appliance.tasks import load_task
    from sandbox.gate import TurnRecord

    pipeline = _pipeline(tmp_path, slots=1)
    task = load_task(softmax_task)
    pipeline.prepare(task)
    other = TurnRecord(group="another evaluation")
    held = pipeline.gate.acquire(other)  # another evaluation measures as this one starts, for 1.5 s
    threading.Timer(1.5, pipeline.gate.release, args=(other, held)).start()
    outcome = pipeline.evaluate(task, candidate("good"))
    pipeline.close()
    assert outcome.verdict == "pass", outcome.reason
    assert len(outcome.details["cases"]) == 6
    assert outcome.details["device_turns"]["turns"] == 6 + 1 + 3 * 2 + 1, outcome.details["device_turns"]
    assert outcome.details["device_turns"]["paused_s"] >= 2.0, outcome.details["device_turns"]  # both, ~1.5 s each
    assert {"load", "eager", "cpu_s"} <= set(outcome.details["stage_s"]["prepare"]), outcome.details





def test_time_up_calls_off_evaluations_that_do_not_measure_yet_and_lets_a_measuring_one_finish(softmax_task, tmp_path):
    """Pipeline.cancel_unmeasured (a run's wall-clock budget spent): an evaluation that has measured gets its verdict;
    one still waiting for the device is called off at once (EvaluationCancelled, its processes killed), without
    waiting for the device to come free."""
    from appliance.errors import EvaluationCancelled
    from appliance.tasks import load_task
    from sandbox.gate import TurnRecord

    pipeline = _pipeline(tmp_path, slots=2)
    task = load_task(softmax_task)
    pipeline.prepare(task)
    before = pipeline.gate.occupancy().get("measuring", 0.0)
    results: dict[str, object] = {}

    def evaluate(name: str) -> None:
        try:
            results[name] = pipeline.evaluate(task, candidate("good"))
        except EvaluationCancelled as e:
            results[name] = e

    measuring = threading.Thread(target=evaluate, args=("measuring",))
    measuring.start()
    deadline = time.monotonic() + 120
    while pipeline.gate.occupancy().get("measuring", 0.0) == before and measuring.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    other = TurnRecord(group="another evaluation")
    held = pipeline.gate.acquire(other)  # the device stays busy: nothing else measures until we say so
    waiting = threading.Thread(target=evaluate, args=("waiting",))
    waiting.start()
    time.sleep(3)  # it starts, and waits for a turn
    assert waiting.is_alive()
    assert pipeline.cancel_unmeasured() == 1  # the waiting one only
    waiting.join(timeout=60)
    assert not waiting.is_alive() and isinstance(results["waiting"], EvaluationCancelled), results.get("waiting")
    pipeline.gate.release(other, held)  # (only now: the cancelled one did not wait for the device)
    measuring.join(timeout=120)
    pipeline.close()
    assert results["measuring"].verdict == "pass", results["measuring"].reason
    assert pipeline.gate.idle() and pipeline.gate.residents() == 0
    assert not list(pipeline.folder.path.glob("eval-*"))  # both job folders removed


def test_a_verdict_written_before_the_call_off_stands_and_a_prepare_waiting_for_the_device_is_called_off(
        softmax_task, tmp_path):
    """A referee that wrote its verdict keeps it, however long the candidate's server then takes to exit (it could
    otherwise trade a failing verdict for a requeue); an evaluation that prepares the task itself, waiting for the
    device, is called off as EvaluationCancelled like any other (not an error of the gate's)."""
    from appliance.errors import EvaluationCancelled
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from appliance.tasks import load_task
    from sandbox.gate import TurnRecord
    from sandbox.jail import Jail

    lingers = tmp_path / "slightly_off_lingers.py"
    lingers.write_text(candidate("slightly_off").read_text() + "\nimport atexit, time\natexit.register(time.sleep, 4)\n")
    pipeline = _pipeline(tmp_path / "a", slots=1)
    task = load_task(softmax_task)
    results: dict[str, object] = {}

    def evaluate(p, path, name) -> None:
        try:
            results[name] = p.evaluate(task, path)
        except EvaluationCancelled as e:
            results[name] = e

    worker = threading.Thread(target=evaluate, args=(pipeline, lingers, "lingers"))
    worker.start()
    deadline = time.monotonic() + 120
    while not list(pipeline.folder.path.glob("eval-*/candidate-*/referee/result.json")):
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.05)
    time.sleep(0.5)  # the record written whole, the server sleeping at its exit
    pipeline.cancel_unmeasured()
    worker.join(timeout=60)
    assert results["lingers"].verdict == "wrong_output", results["lingers"]

    fresh = Pipeline(Jail(), EvalSettings(device="cpu", baselines=("eager",), timing_budget_s=0.05,
                                          jobs_dir=tmp_path / "b", reuse_inputs=False))  # each prepares its own
    other = TurnRecord(group="another evaluation")
    held = fresh.gate.acquire(other)
    worker = threading.Thread(target=evaluate, args=(fresh, candidate("good"), "preparing"))
    worker.start()
    time.sleep(3)
    assert fresh.cancel_unmeasured() == 1
    worker.join(timeout=60)
    fresh.gate.release(other, held)
    assert isinstance(results["preparing"], EvaluationCancelled), results["preparing"]
    assert fresh.gate.idle() and fresh.gate.residents() == 0 and fresh.gate.waiting() == 0


def test_an_evaluation_waiting_for_the_runs_prepare_is_called_off_without_waiting_for_it(softmax_task, tmp_path):
    """The run prepares the task ahead (Pipeline.prepare, on a thread of its own); an evaluation waiting for those
    baselines is called off at once, and the prepare goes on (it serves the run's next session too)."""
    from appliance.errors import EvaluationCancelled
    from appliance.tasks import load_task
    from sandbox.gate import TurnRecord

    pipeline = _pipeline(tmp_path, slots=2)
    task = load_task(softmax_task)
    other = TurnRecord(group="another evaluation")
    held = pipeline.gate.acquire(other)  # the prepare waits for the device, holding the task's preparation
    ahead = threading.Thread(target=pipeline.prepare, args=(task,))
    ahead.start()
    result: dict[str, object] = {}

    def evaluate() -> None:
        try:
            result["outcome"] = pipeline.evaluate(task, candidate("good"))
        except EvaluationCancelled as e:
            result["outcome"] = e

    waiting = threading.Thread(target=evaluate)
    waiting.start()
    time.sleep(2)
    assert pipeline.cancel_unmeasured() == 1
    waiting.join(timeout=10)
    assert not waiting.is_alive() and isinstance(result["outcome"], EvaluationCancelled), result
    assert "baselines were being prepared" in str(result["outcome"])
    pipeline.gate.release(other, held)
    ahead.join(timeout=120)
    assert pipeline._prepared  # the prepare finished, kept for the next evaluation
    pipeline.close()


def test_a_candidate_killed_while_the_hosts_oom_killer_fired_is_not_blamed(softmax_task, tmp_path, monkeypatch):
    """SIGKILL that no limit of ours sent, while the kernel's OOM kill count rose: the host ran out of memory (the
    count is the kernel's, /proc/vmstat; a real host OOM is not provoked here, so it is made to rise)."""
    from appliance.errors import InfrastructureError
    from appliance.tasks import load_task
    from sandbox import jail as jail_module

    assert isinstance(jail_module.host_oom_kills(), int)  # this kernel keeps the count
    pipeline = _pipeline(tmp_path, slots=1)
    task = load_task(softmax_task)
    outcome = pipeline.evaluate(task, candidate("killed"))
    assert outcome.verdict == "crashed" and "SIGKILL" in outcome.reason, outcome.reason  # no OOM kill on the host
    counts = iter(range(1000))
    monkeypatch.setattr(jail_module, "host_oom_kills", lambda: next(counts))
    if pipeline.evaluate(task, candidate("segfaults")).details["jail"]["limits"]["cgroup"].startswith("v"):
        # Beside cgroups the count includes neighbours' memory_limit kills: no excuse there.
        assert pipeline.evaluate(task, candidate("killed")).verdict == "crashed"
    pipeline.close()
    # A host where no cgroup can be made (the H200 host until the jail delegated v2 itself), under the opt-out.
    monkeypatch.setattr(jail_module.JobCgroup, "create", _no_cgroup)
    pipeline.jail = jail_module.Jail(unsafe_no_memory_limit=True)
    with pytest.raises(InfrastructureError, match="the host's OOM killer fired"):
        pipeline.evaluate(task, candidate("killed"))
    assert pipeline.evaluate(task, candidate("segfaults")).verdict == "crashed"  # another signal stays its own
    pipeline.close()


def _no_cgroup(*args):
    from sandbox.cgroup import CgroupUnavailable

    raise CgroupUnavailable("no cgroup here (test)")





def test_a_candidate_cannot_rewrite_its_source(softmax_task, tmp_path):
    """The kernel server loads the submitted source from a folder its jail mounts read-only: a candidate that
    rewrote it would choose what its retry alone (after running out of memory beside others) or its profile run
    evaluates."""
    from appliance.tasks import load_task

    pipeline = _pipeline(tmp_path, slots=1)
    outcome = pipeline.evaluate(load_task(softmax_task), candidate("rewrites_its_source"))
    pipeline.close()
    assert outcome.verdict == "pass", outcome.reason
    assert re.search("source rewrite refused: (Read-only file system|Permission denied)",
                     outcome.details["candidate_stderr"]), outcome.details["candidate_stderr"]


def test_ceilings_come_from_a_cache_of_the_same_gpu_and_driver_and_anything_else_is_measured_again(tmp_path):
    """A worker's first prepare measures the GPU's ceilings and caches them (per GPU model and driver); a later
    worker reads that cache instead. A cache of another driver, or one torn or garbled, is measured again (here,
    without a GPU, measuring fails: the roofline is lost, never the evaluation)."""
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from sandbox.jail import Jail

    def pipeline():
        return Pipeline(Jail(), EvalSettings(device="cpu", state_dir=tmp_path / "state", jobs_dir=tmp_path))

    h200 = {"gpu": "NVIDIA H200", "driver": "580.1"}
    pipeline()._keep_ceilings({"measured": {"read_bytes_per_s": 4.4e12}}, h200)
    (job := tmp_path / "job").mkdir()
    assert pipeline()._device_ceilings(job, h200, [])["measured"] == {"read_bytes_per_s": 4.4e12}
    assert not (job / "ceilings").exists()  # nothing was run

    other_driver = pipeline()._device_ceilings(job, h200 | {"driver": "590.2"}, [])
    assert "measuring the GPU's ceilings failed" in other_driver["error"]
    cache, = (tmp_path / "state").glob("ceilings-gpu*.json")
    cache.write_text('{"key": "NVIDIA H200|580.1", "meas')  # torn
    (job2 := tmp_path / "job2").mkdir()
    assert "measuring the GPU's ceilings failed" in pipeline()._device_ceilings(job2, h200, [])["error"]
