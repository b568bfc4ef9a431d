"""The GPU path (run on the GPU machine: `pytest -m gpu`); skipped cleanly without CUDA."""

from __future__ import annotations

import pytest

from tests.conftest import REPO, candidate

pytestmark = pytest.mark.gpu


def test_honest_candidate_on_gpu_with_both_baselines(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, candidate("good"), "--baselines", "eager,compile",
                                       "--mode", "full", device="cuda")
    assert code == 0, result
    assert result["device"] == "cuda" and result["jailed"] is True
    impls = {t["implementation"] for t in result["timings"] if t["shape"] == "main"}
    assert impls == {"candidate", "eager", "compile"}
    assert all(t["device"] == "cuda" and t["median_ms"] > 0 for t in result["timings"] if not t["error"])
    env = result["environment"]
    assert env["gpu"] and env["driver"] and env["cuda"]


@pytest.mark.parametrize("name,verdict", [("slightly_off", "wrong_output"), ("edge_wrong", "wrong_output"),
                                          ("compile_error", "compile_error"), ("nan", "nan_inf")])
def test_broken_candidate_on_gpu(appliance, softmax_task, name, verdict):
    code, result = appliance.eval_json(softmax_task, candidate(name), "--mode", "full", device="cuda")
    assert code == 1 and result["verdict"] == verdict, result["reason"]


@pytest.mark.parametrize("settings", [{}, {"PART_BLOCK": 8192}, {"PART_BLOCK": 2048, "NUM_WARPS": 4}],
                         ids=["default", "rows_in_parts", "small_parts"])
def test_bundled_baseline_full_size_on_gpu(appliance, tmp_path, settings):
    """The softmax baseline passes the gate at every shape, also with its rows split into parts (a GPU-only path:
    the parts of a row wait for each other, which the interpreter cannot run)."""
    from appliance.proposers.tune import with_values

    task = REPO / "benchmarks/tasks/softmax.py"
    baseline = tmp_path / "softmax.py"
    baseline.write_text(with_values((REPO / "benchmarks/baselines/softmax.py").read_text(), settings))
    code, result = appliance.eval_json(task, baseline, device="cuda")
    assert code == 0, result
    assert result["mode"] == "full"


@pytest.mark.parametrize("name", ["cuda_inline_softmax", "cuda_inline_softmax_split", "cupy_softmax"])
def test_cuda_and_cupy_candidates_on_gpu(appliance, softmax_task, tmp_path, name):
    task = tmp_path / "rowsoftmax.py"
    task.write_text(softmax_task.read_text())
    manifest = softmax_task.with_suffix(".toml").read_text().replace('backends = ["triton"]',
                                                                      'backends = ["triton", "cuda", "cupy"]')
    task.with_suffix(".toml").write_text(manifest)
    code, result = appliance.eval_json(task, candidate(name), "--mode", "full", device="cuda")
    assert code == 0, result["reason"]
    assert result["device"] == "cuda" and result["jailed"] is True
    if name.startswith("cuda_inline"):  # the jailed build found torch's headers precompiled by the worker
        assert result["precompiled_headers"] == "ready" or result["precompiled_headers"].startswith("built"), result


def test_gpu_kernel_that_never_ends_is_killed_and_the_gpu_stays_usable(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, REPO / "tests/fixtures/gpu/spins_forever.py", "--timeout", "30",
                                       "--mode", "full", device="cuda")
    assert code == 1 and result["verdict"] == "timeout", result["reason"]
    code, result = appliance.eval_json(softmax_task, candidate("good"), "--mode", "full", device="cuda")
    assert code == 0, result["reason"]


def test_jail_on_gpu_has_seccomp_a_memory_limit_and_no_host_root(appliance, softmax_task):
    import os

    code, result = appliance.eval_json(softmax_task, candidate("good"), "--mode", "full", device="cuda")
    assert code == 0, result["reason"]
    assert result["memory_limited"] is True
    shown = __import__("json").loads(appliance("show", str(result["evaluation_id"]), "--json").stdout)
    limits = shown["details"]["jail"]["limits"]
    assert limits["seccomp"] is True and limits["cgroup"] in ("v1", "v2") and "memory_bytes" in limits, limits
    if os.geteuid() == 0:
        assert limits["identity"].startswith("host-uid uid 2"), limits


def test_memory_and_fork_bombs_on_the_gpu_host_get_their_named_verdicts(appliance, softmax_task, tmp_path):
    """The H200 host: cgroup v2 with only memory delegated. The memory bomb is killed inside its own cgroup (no
    global OOM), the fork bomb is stopped by the pids controller or RLIMIT_NPROC; the GPU stays usable."""
    from tests.sandbox.test_hostile import HOSTILE, hostile, processes_with, unique_digits

    code, result = appliance.eval_json(softmax_task, HOSTILE / "memory_bomb.py", "--memory-limit", "4",
                                       device="cuda")
    assert (code, result["verdict"]) == (1, "memory_limit"), result["reason"]
    marker = f"86400.{unique_digits()}"
    code, result = appliance.eval_json(softmax_task, hostile("fork_bomb", tmp_path, marker=marker),
                                       "--pids-limit", "256", device="cuda")
    assert (code, result["verdict"]) == (1, "process_limit"), result["reason"]
    assert processes_with(marker) == []
    code, result = appliance.eval_json(softmax_task, candidate("good"), "--mode", "full", device="cuda")
    assert code == 0, result["reason"]


GPU_GAMING = {  # name -> (accepted verdicts, words in the reason)
    # Work on a side stream is inside the referee's clock now (the server synchronises the device before it
    # answers, and the referee reads the outputs itself): it is timed, not hidden.
    "side_stream": ({"pass", "deferred_work"}, []),
    "allocator_reuse": ({"wrong_output", "timed_output_mismatch", "nan_inf"}, []),
    # Its own process's events and timers are nobody's clock: it passes at its true time.
    "patches_events": ({"pass"}, []),
}


@pytest.mark.parametrize("name", sorted(GPU_GAMING))
def test_gpu_gaming_candidate_is_rejected(appliance, softmax_task, name):
    verdicts, words = GPU_GAMING[name]
    code, result = appliance.eval_json(softmax_task, REPO / f"tests/fixtures/gpu/{name}.py", "--mode", "full",
                                       device="cuda")
    assert result["verdict"] in verdicts, (result["verdict"], result["reason"])
    for word in words:
        assert word in result["reason"], result["reason"]


# The referee's adversarial suite (tests/evaluation/test_referee.py) on the GPU, where outputs are made in the
# arena and the server may say where they are: name -> (verdict, stage, words in the reason).
GPU_REFEREE = {
    # Offset 0 is where the arena's first allocation goes: at the first shape it may hold the honest output (then
    # the first timed batch puts every call there: shared memory), at the next it holds some other tensor's bytes.
    "places_outside_the_arena": ("wrong_output", None, []),
    "rebinds_the_server": ("nan_inf", "correctness", ["NaN/Inf"]),
    "skips_most_timed_calls": ("timed_output_mismatch", "timing", ["timed call"]),
    "answers_before_the_work": ("timed_output_mismatch", "timing", ["timed call"]),
    "late_writer": ("deferred_work", "correctness", ["changed after forward returned"]),
    "corrupts_after_check": ("deferred_work", "correctness", ["changed after forward returned"]),
}


@pytest.mark.parametrize("name", sorted(GPU_REFEREE))
def test_referee_attacks_on_the_gpu(appliance, softmax_task, name):
    verdict, stage, words = GPU_REFEREE[name]
    code, result = appliance.eval_json(softmax_task, REPO / f"tests/fixtures/referee/{name}.py", "--mode", "full",
                                       device="cuda")
    assert result["verdict"] == verdict and stage in (None, result["stage"]), result["reason"]
    for word in words:
        assert word in result["reason"], result["reason"]


def test_honest_candidate_on_its_own_stream_passes(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, REPO / "tests/fixtures/gpu/own_stream_honest.py", "--mode",
                                       "full", device="cuda")
    assert code == 0, result["reason"]


def test_gpu_evidence_referee_timing_energy_roofline_and_ncu(appliance, softmax_task):
    code, result = appliance.eval_json(softmax_task, candidate("good"), "--mode", "full", "--profile", device="cuda")
    assert code == 0, result["reason"]
    cand = next(t for t in result["timings"] if t["shape"] == "main" and t["implementation"] == "candidate")
    assert cand["batches"] >= 15 and cand["checked_calls"] >= 1 and cand["read_ms"] < cand["median_ms"], cand
    assert cand["outputs_in_arena"] == 1.0, cand  # made where the referee reads them: nothing copied
    # The test task's full size is 8 x 128: a few microjoules a call, below what NVML's counter resolves over the
    # energy window (it read 0.0 on the H200); present, never negative.
    assert cand["energy_j_per_call"] >= 0 and 0 < cand["roofline_fraction"] < 1.2, cand
    evidence = result["evidence"]
    assert evidence["launches_per_call"] == 1
    assert evidence["ceilings"]["measured"]["read_bytes_per_s"] > 1e12
    print("\nceilings", evidence["ceilings"], "\nncu", result["ncu"], "\ntiming", cand)
    # Read at all (under either of Nsight Compute's names for it): the test task's "full" size is 8 x 128, a few KB,
    # so the share of DRAM bandwidth is tiny (0.07 % on the H200), but a metric that was not found reads 0.
    assert result["ncu"]["dram_throughput_pct"] > 0, result["ncu"]
