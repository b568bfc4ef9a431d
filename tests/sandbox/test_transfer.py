"""Output files (written by the untrusted candidate, read by the trusted check) and the staged host<->device copies."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from sandbox.harness import transfer
from sandbox.harness.transfer import OutputRecord, Staging, create_output_file


def _write(tmp_path, name, outs, extra=None):
    for o, dst in zip(outs, create_output_file(tmp_path, name, outs, extra)):
        Staging("cpu").download(o, dst)


def test_outputs_round_trip_through_their_files(tmp_path):
    # A float64 after 75 bytes of others: mapped at an offset it cannot be viewed at, so it is copied aligned.
    outs = [torch.randn(3, 5), torch.arange(7, dtype=torch.int16), torch.tensor(True),
            torch.randn(2, dtype=torch.float64), torch.empty(0, 4)]
    _write(tmp_path, "main-0", outs, {"seed": 0, "rolls": 3})
    record = OutputRecord(tmp_path, "main-0", max_bytes=1 << 20)
    assert record.extra == {"seed": 0, "rolls": 3}
    back = record.upload(Staging("cpu"))
    assert [(b.dtype, b.shape) for b in back] == [(o.dtype, o.shape) for o in outs]
    assert all(torch.equal(b, o) for b, o in zip(back, outs))
    # The raw bytes are all there is: no pickle, nothing to unpickle.
    assert (tmp_path / "main-0.bin").stat().st_size == 15 * 4 + 7 * 2 + 1 + 2 * 8


def test_output_files_made_ready_ahead_are_used_and_resized_to_the_outputs_they_get(tmp_path):
    """The expected sizes are allocated and mapped ahead; outputs of another size (a wrong shape) still round-trip."""
    ready = transfer.OutputFiles(tmp_path, {"a": 64, "b": 1 << 16, "c": 0}, Staging("cpu"))
    ready.wait()
    assert (tmp_path / "b.bin").stat().st_size == 1 << 16 and (tmp_path / "c.bin").stat().st_size == 0
    for name, outs in (("a", [torch.ones(16)]), ("b", [torch.ones(3)]), ("c", [torch.ones(2)])):
        for o, dst in zip(outs, create_output_file(tmp_path, name, outs, ready=ready)):
            ready.staging.download(o, dst)
    assert ready.take("a", 64) is not None and ready.take("b", 12) is None  # b got a file of its own size
    ready.close()
    for name, n in (("a", 16), ("b", 3), ("c", 2)):
        [back] = OutputRecord(tmp_path, name, 1 << 20).upload(Staging("cpu"))
        assert torch.equal(back, torch.ones(n))


def test_a_transposed_output_is_written_in_its_logical_order(tmp_path):
    out = torch.arange(12.0).reshape(3, 4).t()
    _write(tmp_path, "t", [out])
    [back] = OutputRecord(tmp_path, "t", 1 << 20).upload(Staging("cpu"))
    assert torch.equal(back, out)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "x.json").write_text("{not json"), "is not JSON"),
    (lambda d: (d / "x.json").write_text(json.dumps({"outs": "all of them"})), "does not list the outputs"),
    (lambda d: (d / "x.json").write_text(json.dumps({"outs": [{"dtype": "os.system", "shape": [1]}]})),
     "an output it cannot have"),
    (lambda d: (d / "x.json").write_text(json.dumps({"outs": [{"dtype": "Tensor", "shape": [1]}]})),
     "an output it cannot have"),
    (lambda d: (d / "x.json").write_text(json.dumps({"outs": [{"dtype": "float32", "shape": [-1]}]})),
     "an output it cannot have"),
    (lambda d: (d / "x.json").write_text(json.dumps({"outs": [{"dtype": "float32", "shape": [1 << 30]}]})),
     "more than they can be"),
    (lambda d: (d / "x.json").write_text(" " * (transfer.RECORD_MAX_BYTES + 1)), "larger than"),
    (lambda d: (d / "x.bin").write_bytes(b"\0" * 7), "holds 7 bytes, its record describes 8"),
    (lambda d: ((d / "x.bin").unlink(), os.symlink("/etc/passwd", d / "x.bin")), "cannot be opened"),
    (lambda d: ((d / "x.bin").unlink(), os.mkfifo(d / "x.bin")), "not a regular file"),
    (lambda d: (d / "x.bin").unlink(), "cannot be opened"),
])
def test_a_damaged_output_file_is_refused_with_its_reason(tmp_path, damage, message):
    _write(tmp_path, "x", [torch.ones(2)])
    damage(tmp_path)
    with pytest.raises(ValueError, match=message):
        OutputRecord(tmp_path, "x", max_bytes=1 << 20)


@pytest.mark.gpu
def test_staged_copies_keep_every_byte_across_chunks(monkeypatch):
    """Sizes that are not a multiple of the chunk, so that both buffers and a short last chunk are used."""
    monkeypatch.setattr(transfer, "CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(transfer, "STREAM_MIN_BYTES", 0)
    staging = Staging("cuda")
    host = torch.randn(5 * (1 << 18) + 17)  # ~5 MiB of float32
    on_device = staging.upload(host)
    assert on_device.is_cuda and torch.equal(on_device.cpu(), host)
    back = torch.empty(host.numel() * 4, dtype=torch.uint8)
    staging.download(on_device * 2, back)
    assert torch.equal(back.view(torch.float32), host * 2)


@pytest.mark.gpu
def test_pinned_files_move_by_dma_and_keep_every_byte():
    """The harness's path: a mapped input file's pages locked in place (read-only) and uploaded; an output file's
    locked and downloaded into; the check's read-only mapping of it locked and uploaded. Data start and end off the
    page boundaries, so the bytes outside whole pages take the plain copy."""
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(dir="/dev/shm"))  # pages are locked in place on a tmpfs only
    assert transfer.in_memory(tmp_path)
    staging = Staging("cuda")
    host = torch.randn(5 * (1 << 20) + 3)  # ~20 MiB: past STREAM_MIN_BYTES
    torch.save({"args": [torch.ones(7), host]}, tmp_path / "set.pt")  # the second tensor starts off a page
    mapped = torch.load(tmp_path / "set.pt", weights_only=True, mmap=True, map_location="cpu")["args"][1]
    assert staging.pin(mapped) and staging.pinned_bytes > 0, "the driver refused to lock a mapped file read-only"
    on_device = staging.upload(mapped)
    torch.cuda.synchronize()
    assert torch.equal(on_device.cpu(), host)
    staging.unpin()
    [dst] = create_output_file(tmp_path, "out", [on_device])
    assert staging.pin(dst, read_only=False)
    staging.download(on_device * 2, dst)
    torch.cuda.synchronize()
    staging.unpin()
    del dst
    record = OutputRecord(tmp_path, "out", 1 << 30)
    record.pin(staging)
    [back] = record.upload(staging)
    assert torch.equal(back.cpu(), host * 2)
    staging.unpin()
    shutil.rmtree(tmp_path)


@pytest.mark.gpu
def test_pins_made_in_the_background_and_kept_pins_survive_unpin():
    """The candidate locks its inputs in a thread while its module loads, and its output files ahead; the check
    keeps its inputs locked across cases (keep=True) while each case's outputs are unlocked after its turn."""
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(dir="/dev/shm"))
    torch.save({"args": [torch.randn(1 << 21), torch.randn(1 << 21)]}, tmp_path / "set.pt")
    a, b = torch.load(tmp_path / "set.pt", weights_only=True, mmap=True, map_location="cpu")["args"]
    staging = Staging("cuda")
    transfer.PinInBackground(staging, [a]).wait()
    assert staging._pinned_span(a.data_ptr(), a.data_ptr() + a.numel() * 4), "the thread locked nothing"
    assert staging.pin(b, keep=True)
    staging.unpin()
    assert staging._pinned_span(a.data_ptr(), a.data_ptr() + a.numel() * 4) is None
    assert staging._pinned_span(b.data_ptr(), b.data_ptr() + b.numel() * 4), "a kept pin was unlocked"
    on_device = staging.upload(b)
    assert torch.equal(on_device.cpu(), b)
    # The candidate's output file, allocated, mapped and locked ahead; the download into it is a DMA.
    ready = transfer.OutputFiles(tmp_path, {"out": b.numel() * 4}, Staging("cuda"))
    ready.wait()
    [dst] = create_output_file(tmp_path, "out", [on_device], ready=ready)
    assert ready.staging._pinned_span(dst.data_ptr(), dst.data_ptr() + dst.numel()), "the output was not locked ahead"
    ready.staging.download(on_device * 2, dst)
    torch.cuda.synchronize()
    ready.close()
    del dst
    [back] = OutputRecord(tmp_path, "out", 1 << 30).upload(Staging("cuda"))
    assert torch.equal(back.cpu(), b * 2)
    shutil.rmtree(tmp_path)


def test_background_pinning_reports_its_failure_and_can_be_cancelled():
    class Refusing:
        def __init__(self):
            self.calls = 0

        def pin(self, value):
            self.calls += 1
            raise RuntimeError("driver gone")

    refusing = Refusing()
    pinning = transfer.PinInBackground(refusing, [1, 2])
    with pytest.raises(RuntimeError, match="driver gone"):
        pinning.wait()
    assert refusing.calls == 1  # stopped at the first failure
    cancelled = transfer.PinInBackground(Staging("cpu"), [torch.zeros(4)] * 1000)
    cancelled.cancel()  # returns once the thread has stopped
    assert not cancelled._thread.is_alive()


def test_only_files_on_a_tmpfs_are_pinned(tmp_path):
    assert transfer.in_memory("/dev/shm") and not transfer.in_memory("/proc/self")
    assert not Staging("cuda", pin_files=False).pin(torch.zeros(1 << 22))


@pytest.mark.parametrize("record, message", [
    ("[" * 60000, "is not JSON"),  # nested too deep for the parser: refused, not a crash
    (json.dumps({"outs": [{"dtype": "qint8", "shape": [1]}]}), "an output it cannot have"),
    (json.dumps({"outs": [{"dtype": "uint3", "shape": [1]}]}), "an output it cannot have"),
    (json.dumps({"outs": [{"dtype": ["float32"], "shape": [1]}]}), "an output it cannot have"),
    (json.dumps({"outs": [{"dtype": "float32", "shape": [0] + [(1 << 40) - 1] * 4}]}), "an output it cannot have"),
    (json.dumps({"outs": [{"dtype": "float32", "shape": [1] * 17}]}), "an output it cannot have"),
    (json.dumps({"outs": [{"dtype": "float32", "shape": [True]}]}), "an output it cannot have"),
])
def test_a_record_the_check_could_not_use_is_refused_before_anything_is_read(tmp_path, record, message):
    (tmp_path / "x.json").write_text(record)
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=message):
        OutputRecord(tmp_path, "x", max_bytes=1 << 20)


def _mapping_of(address: int) -> str:
    """The permissions of the mapping of this process that holds `address` (e.g. r--s: read-only, shared)."""
    for line in open("/proc/self/maps"):
        span, perms = line.split()[:2]
        start, end = (int(x, 16) for x in span.split("-"))
        if start <= address < end:
            return perms
    return ""


def _saved_inputs(path):
    wide = torch.randn(300, 1000)
    value = {"init": [7, torch.ones(3)], "args": [wide, 3, torch.randn(40, 50).t(), wide[5:], torch.empty(0),
                                                  torch.arange(10)]}
    torch.save(value, path)
    return value


def test_inputs_locked_in_place_are_mapped_shared_and_read_only(tmp_path):
    """Locking a private (copy-on-write) mapping's pages makes the kernel copy them first (each process held its own
    copy of every input on the H200 host): the args to lock are mapped shared, read-only, with the same values."""
    value = _saved_inputs(tmp_path / "set.pt")
    loaded = transfer.load_inputs(tmp_path / "set.pt", shared=True)
    for saved, got in zip(value["args"], loaded["args"]):
        if isinstance(saved, torch.Tensor):
            assert got.dtype == saved.dtype and got.shape == saved.shape and got.stride() == saved.stride()
            assert torch.equal(got, saved)
            if got.numel():
                assert _mapping_of(got.data_ptr()) == "r--s"
        else:
            assert got == saved
    loaded["init"][1].add_(1)  # init goes to a constructor, which may write to it: torch's private mapping
    assert _mapping_of(loaded["init"][1].data_ptr()).endswith("p")
    private = transfer.load_inputs(tmp_path / "set.pt", shared=False)  # the CPU harness's: forward may write to it
    private["args"][0].mul_(2)
    assert _mapping_of(private["args"][0].data_ptr()) == "rw-p"
    assert torch.equal(transfer.load_inputs(tmp_path / "set.pt", shared=True)["args"][0], value["args"][0])


def test_inputs_of_a_layout_not_understood_stay_on_torchs_own_mapping(tmp_path):
    torch.save([torch.ones(4)], tmp_path / "list.pt")  # not {"init", "args"}
    assert torch.equal(transfer.load_inputs(tmp_path / "list.pt", shared=True)[0], torch.ones(4))


def test_tensors_nested_in_args_stay_writable_and_a_storage_reached_otherwise_keeps_torchs_mapping(tmp_path):
    """Only top-level args are locked and uploaded: a nested one reaches forward as it is, so it must stay writable.
    A storage the loader cannot find (inside a set) would shift every offset: the values must still be right."""
    torch.save({"init": [], "args": [[torch.ones(3)], torch.ones(2)]}, tmp_path / "nested.pt")
    nested = transfer.load_inputs(tmp_path / "nested.pt", shared=True)["args"]
    nested[0][0].add_(1)  # would be a SIGSEGV on the read-only mapping
    assert _mapping_of(nested[1].data_ptr()) == "r--s"
    a, b = torch.full((1000,), 2.0), torch.full((1000,), 3.0)
    torch.save({"init": [{torch.ones(1000)}], "args": [a, b]}, tmp_path / "set.pt")
    got = transfer.load_inputs(tmp_path / "set.pt", shared=True)["args"]
    assert torch.equal(got[0], a) and torch.equal(got[1], b)


@pytest.mark.parametrize("init", [[], [torch.ones(3)], [torch.ones(3), torch.zeros(0), torch.ones(7)]])
def test_one_input_tensor_beside_init_tensors_is_mapped_shared(tmp_path, init):
    x = torch.randn(1000)
    torch.save({"init": init, "args": [x]}, tmp_path / "set.pt")
    [got] = transfer.load_inputs(tmp_path / "set.pt", shared=True)["args"]
    assert torch.equal(got, x) and _mapping_of(got.data_ptr()) == "r--s"


@pytest.mark.gpu
def test_locking_inputs_in_place_copies_nothing_into_private_memory():
    """The regression test of the copy: locking 1 GiB of mapped inputs adds (nearly) nothing to the process's private
    memory when they are mapped shared; a private mapping's lock adds the whole GiB (the kernel's copy)."""
    from sandbox.harness.common import anon_rss_gib

    folder = tempfile.mkdtemp(dir="/dev/shm")
    try:
        torch.save({"init": [], "args": [torch.randn(1 << 28)]}, f"{folder}/set.pt")  # 1 GiB
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        grown = {}
        for shared in (True, False):
            staging = Staging("cuda")
            [arg] = transfer.load_inputs(Path(folder) / "set.pt", shared=shared)["args"]
            before = anon_rss_gib()
            assert staging.pin(arg, keep=False)
            grown[shared] = anon_rss_gib() - before
            assert torch.equal(staging.upload(arg).cpu()[:1000], arg[:1000])
            staging.unpin()
            del arg
        assert grown[True] < 0.1 and grown[False] > 0.9, grown
    finally:
        shutil.rmtree(folder)
