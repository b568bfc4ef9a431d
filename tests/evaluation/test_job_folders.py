"""Job folders of processes that were killed are swept by the next process to claim one (job_folders.py)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from appliance.evaluation.job_folders import OWNER, PREFIX, JobFolder, sweep

REPO = Path(__file__).resolve().parents[2]
CLAIM = """
import sys, time
from appliance.evaluation.job_folders import JobFolder
folder = JobFolder(sys.argv[1]).path
(folder / "inputs.bin").write_bytes(b"x" * 4096)
print(folder, flush=True)
time.sleep(600)
"""


def claimer(root: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", CLAIM, str(root)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_owners_folder_is_swept_and_nothing_else_is(tmp_path):
    killed, killed_folder = claimer(tmp_path)
    alive, alive_folder = claimer(tmp_path)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        unrelated = tmp_path / "someone-elses"
        unrelated.mkdir()
        unlocked_lookalike = tmp_path / f"{PREFIX}without-owner"  # named like ours, but never claimed
        unlocked_lookalike.mkdir()
        assert killed_folder.is_dir() and (killed_folder / "inputs.bin").is_file()

        mine = JobFolder(tmp_path)
        assert mine.path.is_dir() and (mine.path / OWNER).is_file()
        assert not killed_folder.exists()  # swept when this one was claimed
        assert (alive_folder / "inputs.bin").is_file()  # its owner holds its lock
        assert unrelated.is_dir() and unlocked_lookalike.is_dir()
        assert sweep(tmp_path) == []  # mine is held too
        mine.release()
        assert sorted(tmp_path.iterdir()) == sorted([alive_folder, unrelated, unlocked_lookalike])
    finally:
        alive.kill()
        alive.wait()
    assert sweep(tmp_path) == [alive_folder]


def test_a_folder_removed_under_its_pipeline_is_claimed_again(tmp_path):
    folder = JobFolder(tmp_path)
    first = folder.path
    os.rename(first, tmp_path / "moved-away")  # e.g. an operator cleaning up by hand
    second = folder.path
    assert second != first and second.is_dir()
    folder.release()
    assert not second.exists()
