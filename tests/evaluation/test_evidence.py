"""The trusted side's judgement of reported numbers: roofline, impossible results, ncu logs."""

from __future__ import annotations

from appliance.evaluation import evidence

H200_LIKE = {"gpu": "NVIDIA H200", "measured": {"read_bytes_per_s": 4.4e12, "write_bytes_per_s": 4.0e12,
                                                 "copy_bytes_per_s": 4.24e12, "bf16_flops": 790e12,
                                                 "tf32_flops": 400e12},
             "datasheet": {"bytes_per_s": 4.8e12, "bf16_flops": 989e12, "tf32_flops": 494e12}}
UNKNOWN_GPU = H200_LIKE | {"datasheet": None}


def test_roofline_fraction_uses_the_best_measured_bandwidth():
    nbytes = 4.4e9  # 1 ms at the measured read bandwidth
    r = evidence.roofline(H200_LIKE, None, nbytes, "float32", 2.0)
    assert r["bound"] == "memory" and abs(r["roofline_fraction"] - 0.5) < 1e-9
    r = evidence.roofline(H200_LIKE, 790e9, 1e6, "bfloat16", 1.0)  # 1 ms of bf16 matmul at the measured rate
    assert r["bound"] == "compute" and abs(r["roofline_fraction"] - 1.0) < 1e-3
    assert evidence.roofline(None, None, nbytes, "float32", 1.0) == {}


def test_read_mostly_kernel_above_copy_bandwidth_is_not_impossible_but_beyond_the_datasheet_is():
    nbytes = 4.24e9
    assert evidence.impossible(H200_LIKE, None, nbytes, "float32", 1.0 / 1.06) is None  # 106% of copy bandwidth
    why = evidence.impossible(H200_LIKE, None, nbytes, "float32", 0.5)
    assert why and "datasheet peak" in why and "8.48 TB/s" in why
    assert evidence.impossible(UNKNOWN_GPU, None, nbytes, "float32", 1.0 / 1.1) is None
    assert "measured ceiling + 15%" in evidence.impossible(UNKNOWN_GPU, None, nbytes, "float32", 0.8)
    assert "TFLOP/s" in evidence.impossible(H200_LIKE, 2e12, None, "bfloat16", 1.0)


NCU_CSV = '''==PROF== Connected to process 12 (/usr/bin/python3)
==PROF== Profiling "softmax_kernel" - 0: 0%....50%....100% - 9 passes
"ID","Kernel Name","gpu__time_duration.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"
"","","nsecond","%","%","ratio","ratio","ratio","ratio"
"0","softmax_kernel","3,000","90.5","60","12.0","1.0","2.0","0.5"
"1","tail_kernel","1,000","10.5","20","1.0","8.0","0.1","0.1"
==PROF== Disconnected from process 12
'''


def test_ncu_log_becomes_a_duration_weighted_summary():
    s = evidence.ncu_summary(NCU_CSV)
    assert s["kernels"] == 2 and s["gpu_time_us"] == 4.0
    assert abs(s["dram_throughput_pct"] - (90.5 * 3 + 10.5) / 4) < 1e-9
    assert abs(s["achieved_occupancy_pct"] - 50.0) < 1e-9
    assert [t["reason"] for t in s["top_stalls"]] == ["long_scoreboard", "barrier", "wait"]
    assert evidence.ncu_summary("==PROF== nothing profiled\n") == {"error": "Nsight Compute reported no kernel for "
                                                                             "the profiled call"}


def test_ncu_summary_reads_the_dram_metric_under_its_newer_name():
    newer = NCU_CSV.replace('"dram__throughput.', '"gpu__dram_throughput.')
    assert abs(evidence.ncu_summary(newer)["dram_throughput_pct"] - (90.5 * 3 + 10.5) / 4) < 1e-9


def test_ncu_command_never_touches_clocks():
    cmd = evidence.ncu_command("/usr/local/cuda/bin/ncu", "/tmp/x.csv")
    assert cmd[cmd.index("--clock-control") + 1] == "none"


def test_without_a_manifest_the_bytes_the_referee_moved_make_impossible_checkable():
    """A bare KernelBench file gives no byte count: the rows take the least the referee moved (its inputs and the
    outputs it collected), and a time below that at the datasheet bandwidth is flagged."""
    from appliance.evaluation.timings import timing_rows
    from appliance.tasks import load_task
    from tests.conftest import FIXTURES

    task = load_task(FIXTURES / "tasks" / "elementwise_log.py")
    task.manifest.bytes = None  # as if no manifest said it
    moved = 128 << 20
    prepared = {"shapes": [{"name": "main", "sizes": dict(task.sizes), "input_bytes": moved // 2,
                            "output_bytes": moved // 2}],
                "timings": {"main": {"eager": {"median_ms": 0.1}}}}
    rows = timing_rows(task, prepared, {"main": {"median_ms": 0.00014}}, "cuda", H200_LIKE)
    row = next(r for r in rows if r["implementation"] == "candidate")
    assert row["bytes"] == moved
    assert "exceed the GPU's memory bandwidth" in evidence.impossible(H200_LIKE, row["flops"], row["bytes"],
                                                                       "float32", row["median_ms"])
