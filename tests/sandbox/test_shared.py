"""Pools shared between processes (sandbox/harness/shared.py): the fd crosses a real AF_UNIX socket to a real child
process, which attaches, reads the referee's inputs and writes outputs the parent then sees."""

import fcntl
import json
import mmap
import os
import socket
import subprocess
import sys

import pytest
import torch

from sandbox.harness.shared import ALIGN, Pool, layout
from tests.conftest import REPO

# The kernel server's side: receives the layout and the pool's fd over the socket, attaches and computes.
CHILD = r"""
import json, socket, sys, torch
from sandbox.harness.shared import Pool
sock = socket.socket(fileno=int(sys.argv[1]))
msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
spec = json.loads(msg)
pool = Pool.attach(spec["device"], fds[0], spec["nbytes"])
x, idx, half, empty, y, yt, half2 = (pool.tensor(e) for e in spec["entries"])
torch.exp(x, out=y)
yt.copy_(x.t() * 2 + idx.sum())
half2.copy_(half * 2)
assert empty.numel() == 0
torch.cuda.synchronize() if spec["device"] != "cpu" else None
pool.close()
sock.sendall(b"done")
"""

SPECS = [("float32", (4, 5), None),  # x
         ("int64", (3, 2), (4, 1)),  # idx: every 4th row of a (3, 4) block, first two columns
         ("bfloat16", (7,), None),  # half: no __cuda_array_interface__ typestr for it
         ("float32", (0, 3), None),  # empty
         ("float32", (4, 5), None),  # y = exp(x)
         ("float32", (5, 4), (1, 5)),  # yt = 2 x^T + sum(idx), a transposed (strided) output
         ("bfloat16", (7,), None)]  # half2 = 2 half


def _round_trip(device: str):
    entries, nbytes = layout(SPECS)
    with Pool.create(device, nbytes) as pool:
        x, idx, half, empty, y, yt, half2 = (pool.tensor(e) for e in entries)
        x.copy_(torch.randn(4, 5))
        idx.copy_(torch.arange(6).view(3, 2))
        half.copy_(torch.linspace(-3, 3, 7))
        for t in (y, yt, half2):
            t.fill_(float("nan"))
        if device != "cpu":
            torch.cuda.synchronize()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(child.fileno())], pass_fds=(child.fileno(),),
                                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        child.close()
        fd = pool.export_fd()
        spec = {"device": device, "nbytes": nbytes, "entries": entries}
        socket.send_fds(parent, [json.dumps(spec).encode()], [fd])
        os.close(fd)
        parent.settimeout(300)
        assert parent.recv(4) == b"done"
        assert proc.wait(timeout=60) == 0
        parent.close()
        assert torch.equal(y, torch.exp(x))
        assert torch.equal(yt, x.t() * 2 + 15)
        assert torch.equal(half2, half * 2) and half2.dtype == torch.bfloat16
        assert empty.shape == (0, 3)


def test_layout_aligns_offsets_and_measures_strided_spans():
    entries, total = layout(SPECS + [("uint8", (3,), None), ("float64", (2, 2), (0, 1))])
    assert all(e["offset"] % ALIGN == 0 for e in entries)
    assert [e["nbytes"] for e in entries] == [80, (1 + 2 * 4 + 1) * 8, 14, 0, 80, (1 + 4 * 1 + 3 * 5) * 4, 14, 3, 16]
    assert entries[0]["strides"] == (5, 1) and entries[3]["strides"] == (3, 1)
    assert [e["offset"] for e in entries] == [0, 512, 1024, 1536, 1536, 2048, 2560, 3072, 3584]
    assert total == 4096 and total >= entries[-1]["offset"] + entries[-1]["nbytes"]
    assert layout([]) == ([], 0)
    for bad in [("float128", (2,), None), ("float32", (2,), (-1,)), ("float32", (2, 2), (1,))]:
        with pytest.raises(ValueError):
            layout([bad])


def test_cpu_pool_shared_with_a_child_process():
    _round_trip("cpu")


@pytest.mark.gpu
def test_cuda_pool_shared_with_a_child_process():
    _round_trip("cuda")


@pytest.mark.gpu
def test_a_device_pool_larger_than_the_gpu_is_out_of_memory_not_a_crash():
    """The referee reports torch's OutOfMemoryError as the device being full (run again alone, else the task's
    error, sandbox/harness/referee.py): a pool the GPU cannot hold must say the same, with its size."""
    from sandbox.harness.task_code import device_out_of_memory

    too_big = 2 * torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError) as caught:
        Pool.create("cuda", too_big)
    assert "cuMemCreate of" in device_out_of_memory(caught.value)


def test_tensor_refuses_entries_past_the_end_or_misaligned():
    entries, _ = layout([("float32", (4,), None)])
    with Pool.create("cpu", 16) as pool:  # its usable size, though the memfd is a page
        assert pool.tensor(entries[0]).shape == (4,)
        for bad in [{"shape": (5,), "nbytes": 20}, {"offset": ALIGN}, {"offset": 4}, {"offset": -ALIGN},
                    {"nbytes": 8}, {"dtype": "float64", "nbytes": 32}]:
            with pytest.raises(ValueError):
                pool.tensor({**entries[0], **bad})
    with pytest.raises(ValueError):
        pool.tensor(entries[0])  # closed


def test_close_is_idempotent_and_views_outlive_the_unmap():
    entries, nbytes = layout([("int32", (8,), None)])
    pool = Pool.create("cpu", nbytes)
    t = pool.tensor(entries[0])
    t.fill_(7)
    pool.close()
    pool.close()
    assert t.sum() == 56  # still mapped: the referee never faults on a stale view
    with pytest.raises(ValueError):
        pool.export_fd()


def test_attach_refuses_a_memfd_the_other_side_could_shrink():
    fd = os.memfd_create("unsealed")
    os.ftruncate(fd, mmap.PAGESIZE)
    with pytest.raises(ValueError, match="sealed"):
        Pool.attach("cpu", fd, 16)
    with pytest.raises(OSError):
        os.fstat(fd)  # attach took ownership and closed it
    with Pool.create("cpu", 100) as pool:
        fd = pool.export_fd()
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
        with pytest.raises(ValueError, match="smaller"):
            Pool.attach("cpu", fd, 2 * mmap.PAGESIZE)
