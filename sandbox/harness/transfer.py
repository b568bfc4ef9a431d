"""Tensors between host and device, and the candidate's outputs on disk.

Gigabytes cross in shared device turns (sandbox/gate.py), and a shared turn holds off every measurement waiting:
it must be short. A DMA is short only from page-locked memory, and page-locking gigabytes costs ~0.4-1 s per GiB on
the H200's host (benchmarks/host_path_probe.py). So a `Staging` streams tensors through two small page-locked
buffers, allocated once per process: a chunk is copied between pageable memory (a memory-mapped file) and one
buffer at memcpy speed while the other buffer's DMA runs.

Output files (written by the untrusted candidate, read by the trusted check): per call, NAME.bin holds its outputs'
bytes back to back and NAME.json says their dtypes and shapes (for a timed call's, also its seed and rolls). The
candidate maps NAME.bin and its downloads land in it directly: there is no serialisation step. The check opens the
files without following links or blocking, checks them (regular, bounded, the size their record says) and reads
the bytes with pread: the files are data, never unpickled.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import stat
from pathlib import Path

CHUNK_BYTES = 64 << 20  # each of the two page-locked buffers
STREAM_MIN_BYTES = 4 << 20  # smaller tensors are copied directly: their memcpy is short anyway
RECORD_MAX_BYTES = 64 << 10  # NAME.json: dtypes and shapes of a few outputs
MAX_OUTPUTS = 64


class Staging:
    """Host <-> device copies of one process, through two reused page-locked chunks. On the CPU there is no device:
    uploads return the host tensor itself (as `tensor.to("cpu")` does), downloads are plain copies."""

    def __init__(self, device: str):
        self.device = device
        self._buffers: list = []  # page-locked uint8 tensors, allocated on first use
        self._events: list = [None, None]  # the last DMA that used each buffer

    # -- uploads ---------------------------------------------------------------------------------------------
    def upload(self, value):
        """A tensor on the device with the values of host tensor `value` (anything else is returned as is)."""
        import torch

        if not isinstance(value, torch.Tensor) or self.device != "cuda":
            return value
        if not value.is_contiguous() or _nbytes(value) < STREAM_MIN_BYTES:
            return value.to(self.device)
        out = torch.empty_like(value, device=self.device)
        src, dst = _as_bytes(value), _as_bytes(out)
        self._stream_up(dst, lambda buf, off, k: buf[:k].copy_(src[off:off + k]))
        return out

    def upload_file(self, fd: int, offset: int, dtype, shape: list[int]):
        """A tensor of `dtype` and `shape` read from the open file `fd` at `offset` (on the device, or the CPU)."""
        import torch

        out = torch.empty(shape, dtype=dtype, device=self.device)
        dst = _as_bytes(out)
        if self.device != "cuda":
            _pread_into(fd, dst.numpy(), offset)
            return out
        self._stream_up(dst, lambda buf, off, k: _pread_into(fd, buf[:k].numpy(), offset + off))
        return out

    def _stream_up(self, dst, fill) -> None:
        import torch

        for i, off in enumerate(range(0, dst.numel(), CHUNK_BYTES)):
            k = min(CHUNK_BYTES, dst.numel() - off)
            buf = self._buffer(i % 2)  # its previous DMA has finished
            fill(buf, off, k)
            dst[off:off + k].copy_(buf[:k], non_blocking=True)
            self._events[i % 2] = torch.cuda.Event()
            self._events[i % 2].record()

    # -- downloads -------------------------------------------------------------------------------------------
    def download(self, value, dst) -> None:
        """Device tensor `value`'s bytes into host uint8 tensor `dst` (e.g. a mapped output file)."""
        src = _as_bytes(value.contiguous())
        if self.device != "cuda" or src.numel() < STREAM_MIN_BYTES:
            dst.copy_(src)
            return
        import torch

        pending = None  # (buffer, offset, length) whose DMA was issued and whose bytes are not yet in dst
        for i, off in enumerate(range(0, src.numel(), CHUNK_BYTES)):
            k = min(CHUNK_BYTES, src.numel() - off)
            buf = self._buffer(i % 2)
            buf[:k].copy_(src[off:off + k], non_blocking=True)
            self._events[i % 2] = torch.cuda.Event()
            self._events[i % 2].record()
            if pending:
                self._drain(dst, *pending)
            pending = (i % 2, off, k)
        if pending:
            self._drain(dst, *pending)

    def _drain(self, dst, j: int, off: int, k: int) -> None:
        self._events[j].synchronize()
        dst[off:off + k].copy_(self._buffers[j][:k])

    def _buffer(self, j: int):
        import torch

        if not self._buffers:
            self._buffers = [torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        if self._events[j] is not None:
            self._events[j].synchronize()
            self._events[j] = None
        return self._buffers[j]


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _as_bytes(t):
    """A contiguous tensor's storage as a flat uint8 tensor (a view: no copy)."""
    import torch

    return t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)


def _pread_into(fd: int, array, offset: int) -> None:
    view = memoryview(array).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise ValueError(f"the file ended {len(view) - done} bytes early")
        done += n


# -- output files ------------------------------------------------------------------------------------------------

def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def create_output_file(outputs_dir: Path, name: str, outs: list, extra: dict | None = None):
    """Write NAME.json for device tensors `outs` and create NAME.bin at its final size, mapped with its pages
    allocated now (outside any turn: a first write into a fresh page costs a fault). Returns the mapping as a
    host uint8 tensor for `Staging.download`, with each output's slice of it."""
    import torch

    record = {"outs": [{"dtype": dtype_name(o.dtype), "shape": list(o.shape)} for o in outs]} | (extra or {})
    (outputs_dir / f"{name}.json").write_text(json.dumps(record))
    sizes = [_nbytes(o) for o in outs]
    total = sum(sizes)
    fd = os.open(outputs_dir / f"{name}.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, total)
        if not total:
            return [torch.empty(0, dtype=torch.uint8) for _ in outs]
        mapped = mmap.mmap(fd, total, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)  # the mapping stays valid
    host = torch.frombuffer(mapped, dtype=torch.uint8)  # keeps `mapped` alive as long as it is used
    slices, off = [], 0
    for size in sizes:
        slices.append(host[off:off + size])
        off += size
    return slices


class OutputRecord:
    """A candidate's output file pair, checked before anything is read. Raises ValueError saying what is wrong."""

    def __init__(self, outputs_dir: Path, name: str, max_bytes: int):
        import torch

        text = _read_small(outputs_dir / f"{name}.json", RECORD_MAX_BYTES)
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{name}.json is not JSON: {exc}") from None
        outs = record.get("outs") if isinstance(record, dict) else None
        if not isinstance(outs, list) or len(outs) > MAX_OUTPUTS:
            raise ValueError(f"{name}.json does not list the outputs")
        self.layout, total = [], 0
        for o in outs:
            dtype = getattr(torch, o.get("dtype", ""), None) if isinstance(o, dict) and isinstance(
                o.get("dtype"), str) and re.fullmatch(r"[a-z0-9_]+", o["dtype"]) else None
            shape = o.get("shape") if isinstance(o, dict) else None
            if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or not all(
                    type(s) is int and 0 <= s < 1 << 40 for s in shape):
                raise ValueError(f"{name}.json describes an output it cannot have: {str(o)[:200]}")
            self.layout.append((dtype, shape))
            numel = 1
            for s in shape:
                numel *= s
            total += numel * dtype.itemsize
        if total > max_bytes:
            raise ValueError(f"{name}.json describes {total} bytes of outputs, more than they can be ({max_bytes})")
        self.extra = {k: v for k, v in record.items() if k != "outs"}
        self.fd = _open_regular(outputs_dir / f"{name}.bin")
        size = os.fstat(self.fd).st_size
        if size != total:
            os.close(self.fd)
            raise ValueError(f"{name}.bin holds {size} bytes, its record describes {total}")

    def upload(self, staging: Staging) -> list:
        """The outputs as tensors on the staging's device (inside a turn on a GPU); the file is closed after."""
        outs, off = [], 0
        try:
            for dtype, shape in self.layout:
                outs.append(staging.upload_file(self.fd, off, dtype, shape))
                off += _nbytes(outs[-1])
        finally:
            self.close()
        return outs

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_regular(path: Path) -> int:
    """Open for reading without following a link or blocking on a FIFO; only a regular file is accepted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{path.name} cannot be opened: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path.name} is not a regular file")
    return fd


def _read_small(path: Path, limit: int) -> str:
    fd = _open_regular(path)
    try:
        if os.fstat(fd).st_size > limit:
            raise ValueError(f"{path.name} is larger than {limit} bytes")
        return os.read(fd, limit + 1).decode("utf-8", errors="replace")
    finally:
        os.close(fd)
