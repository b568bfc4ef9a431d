"""The host-memory budget: evaluations hold their estimate while in flight; only as many run as fit."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from appliance.evaluation.host_memory import PROCESS_BYTES, HostMemory, evaluation_bytes, mem_total_bytes

GIB = 2**30


def _meminfo(tmp_path, gib: float):
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {int(gib * 2**20)} kB\nMemFree:        1024 kB\n")
    return path


def test_the_budget_is_a_share_of_memtotal_read_again_as_it_changes(tmp_path):
    meminfo = _meminfo(tmp_path, 64)
    memory = HostMemory(share=0.5, meminfo=meminfo)
    assert memory.budget() == int(64 * GIB * 0.75 * 0.5)
    _meminfo(tmp_path, 128)  # memory hot-plugged into a VM
    assert memory.budget() == int(128 * GIB * 0.75 * 0.5)
    assert HostMemory(total_bytes=10 * GIB, share=0.5, meminfo=meminfo).budget() == 5 * GIB
    assert HostMemory(meminfo=tmp_path / "missing").budget() is None  # unreadable: no bound
    assert mem_total_bytes(meminfo) == 128 * GIB


def test_an_evaluation_counts_two_processes_and_its_output_files_only_where_they_take_memory():
    assert evaluation_bytes(4 * GIB, "cuda", outputs_in_memory=True) == 2 * PROCESS_BYTES["cuda"] + 4 * GIB
    assert evaluation_bytes(4 * GIB, "cuda", outputs_in_memory=False) == 2 * PROCESS_BYTES["cuda"]
    assert evaluation_bytes(0, "cpu", outputs_in_memory=True) == 2 * PROCESS_BYTES["cpu"]


def test_holders_beyond_the_budget_wait_in_arrival_order_and_a_big_one_runs_alone():
    memory = HostMemory(total_bytes=10)
    order: list[str] = []
    first = memory.hold(6)
    first.__enter__()

    def later(name: str, nbytes: int):
        with memory.hold(nbytes) as waited:
            order.append((name, waited > 0))
            time.sleep(0.05)

    big = threading.Thread(target=later, args=("big", 100))  # bigger than the whole budget
    small = threading.Thread(target=later, args=("small", 1))  # would fit now, but arrived after big
    big.start()
    time.sleep(0.1)
    small.start()
    time.sleep(0.2)
    assert order == [] and memory.held() == 6  # big waits for the room to empty; small waits behind it
    first.__exit__(None, None, None)
    big.join(5), small.join(5)
    assert order == [("big", True), ("small", True)]
    assert memory.held() == 0


def test_a_budget_read_from_memtotal_admits_more_once_memory_grows(tmp_path):
    meminfo = _meminfo(tmp_path, 4)  # 3 GiB budget
    memory = HostMemory(meminfo=meminfo)
    started = threading.Event()
    with memory.hold(2 * GIB):
        def second():
            with memory.hold(2 * GIB):
                started.set()

        t = threading.Thread(target=second)
        t.start()
        assert not started.wait(0.3)  # 4 GiB do not fit in 3
        _meminfo(tmp_path, 8)  # the VM's memory grew: 6 GiB budget, nothing released
        assert started.wait(3), "the grown budget was not noticed"
        t.join()


def test_a_hold_is_given_back_when_its_block_raises():
    memory = HostMemory(total_bytes=10)
    with pytest.raises(RuntimeError):
        with memory.hold(8):
            raise RuntimeError("the evaluation broke")
    assert memory.held() == 0
    with memory.hold(8) as waited:
        assert waited < 0.5


@pytest.mark.parametrize("value", ["0", "-3", "lots", "inf", "nan"])
def test_a_host_memory_setting_the_appliance_cannot_use_is_refused_by_name(monkeypatch, value):
    from appliance.config import Settings
    from appliance.errors import ConfigError

    monkeypatch.setenv("APPLIANCE_HOST_MEMORY_GIB", value)
    with pytest.raises(ConfigError, match="APPLIANCE_HOST_MEMORY_GIB"):
        Settings.load()
    monkeypatch.setenv("APPLIANCE_HOST_MEMORY_GIB", "96.5")
    assert Settings.load().host_memory_bytes == int(96.5 * GIB)


def test_a_gpu_workers_share_leaves_out_the_model_servers_gpu(monkeypatch):
    """Each evaluation GPU's worker takes an even share; the GPU named by APPLIANCE_LLM_GPU has no worker. (A fake
    NVML: this host has no GPU to count.)"""
    import types

    from appliance.evaluation.residency import evaluation_gpus

    nvml = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 4)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("APPLIANCE_LLM_GPU", raising=False)
    assert evaluation_gpus() == 4
    monkeypatch.setenv("APPLIANCE_LLM_GPU", "0")
    assert evaluation_gpus() == 3
    monkeypatch.setenv("APPLIANCE_LLM_GPU", "7")  # not on this host (a remote model server)
    assert evaluation_gpus() == 4
    nvml.nvmlDeviceGetCount = lambda: 1
    monkeypatch.setenv("APPLIANCE_LLM_GPU", "0")
    assert evaluation_gpus() == 1  # never below one
