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


def test_a_run_cut_by_a_time_limit_still_gets_its_row_from_its_database(tmp_path):
    import argparse
    import json
    import sqlite3

    from benchmarks.optimize_suite import COLUMNS, cut_row

    args = argparse.Namespace(executor=None, gpus="0")
    assert cut_row("rmsnorm", tmp_path, 30.0, None, args, "cuda")[1] == "0 (cut)"  # no database yet
    db = sqlite3.connect(tmp_path / "appliance.db")
    db.execute("CREATE TABLE run (id INTEGER PRIMARY KEY)")
    db.execute("CREATE TABLE evaluation (run_id INTEGER, created_at TEXT, details TEXT)")
    db.executemany("INSERT INTO run VALUES (?)", [(1,), (2,)])
    rows = [(1, "2026-12-06T10:00:00", "{}")] + [(2, f"2026-12-06T10:0{i}:00", json.dumps({"gpu_index": 0}))
                                                 for i in range(1, 7)]
    db.executemany("INSERT INTO evaluation VALUES (?, ?, ?)", rows)
    db.commit()
    db.close()
    row = cut_row("benchmarks/tasks/rmsnorm.py", tmp_path, 360.0, 0.5, args, "cuda")
    assert len(row) == len(COLUMNS)
    assert row[0] == "rmsnorm" and row[1] == "6 (cut)"  # the last run's evaluations only
    assert row[COLUMNS.index("evals / GPU-h")] == "60" and row[-1] == "gpu 0: 6"
