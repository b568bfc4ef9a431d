"""The benchmark suite's report of where a run's device time went (benchmarks/optimize_suite.py)."""

from benchmarks.optimize_suite import device_states


def test_device_states_are_the_change_between_the_first_and_last_snapshot_per_gpu():
    details = [
        {"gpu_index": 0, "device_gate": {"measuring": 10.0, "shared": 5.0, "idle": 85.0}},
        {"gpu_index": 1, "device_gate": {"measuring": 1.0, "idle": 1.0}},
        {"gpu_index": 0, "device_gate": {"measuring": 40.0, "shared": 25.0, "idle": 95.0,
                                         "shared, a measurement waiting": 10.0}},
        {"gpu_index": 0},  # failed before its check: no snapshot
    ]
    text = device_states(details)
    # GPU 0 spent 70 s between its snapshots: 30 measuring, 20 shared, 10 waited out, 10 idle. GPU 1 had one.
    assert text == ("; device states: gpu 0: measuring 43%, shared 29%, idle 14%, shared, a measurement waiting 14% "
                    "of 70 s")
    assert device_states([{"gpu_index": 0}]) == ""
