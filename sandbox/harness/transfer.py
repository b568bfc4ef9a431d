"""Tensors between host and device, and the candidate's outputs on disk.

Gigabytes cross in shared device turns (sandbox/gate.py), and a shared turn holds off every measurement waiting:
it must be short. A DMA is short only from page-locked memory, and page-locking gigabytes costs ~0.4-1 s per GiB on
the H200's host (benchmarks/host_path_probe.py). So a `Staging` streams tensors through two small page-locked
buffers, allocated once per process: a chunk is copied between pageable memory (a memory-mapped file) and one
buffer at memcpy speed while the other buffer's DMA runs.

Better still, the files' own pages are page-locked where they lie (`Staging.pin`, the driver's cuMemHostRegister),
before the turn: a mapped file's pages are already in memory, so locking them copies nothing, and the copy in the
turn is a DMA alone, with no memcpy through the host's memory bus, which a dozen processes share. Where the driver
refuses (read-only registration unsupported, no driver), the copy is staged as above.

Output files (written by the untrusted candidate, read by the trusted check): per call, NAME.bin holds its outputs'
bytes back to back and NAME.json says their dtypes and shapes (for a timed call's, also its seed and rolls). The
candidate maps NAME.bin and its downloads land in it directly: there is no serialisation step. The check opens the
files without following links or blocking, checks them (regular, bounded, the size their record says) and maps
the bytes read-only: the files are data, never unpickled.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import stat
import threading
import warnings
from pathlib import Path

CHUNK_BYTES = 64 << 20  # each of the two page-locked buffers
STREAM_MIN_BYTES = 4 << 20  # smaller tensors are copied directly: their memcpy is short anyway
RECORD_MAX_BYTES = 64 << 10  # NAME.json: dtypes and shapes of a few outputs
MAX_OUTPUTS = 64
MAX_DIMS = 16
# The dtypes an output file may hold, and their bytes (for the controller, which does not import torch): those
# tensors are computed in, not quantized or sub-byte ones (which cannot even be copied), so that a record naming
# an odd one is refused as such instead of failing the check later.
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "complex128": 16, "complex64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # map with the pages in place (Linux)
_PAGE = mmap.PAGESIZE
_REGISTER_PORTABLE, _REGISTER_READ_ONLY = 0x1, 0x8  # CU_MEMHOSTREGISTER_* flags
_driver_lib: list = []  # [libcuda or None], loaded on first use


class Staging:
    """Host <-> device copies of one process, through two reused page-locked chunks. On the CPU there is no device:
    uploads return the host tensor itself (as `tensor.to("cpu")` does), downloads are plain copies."""

    def __init__(self, device: str, pin_files: bool = True):
        self.device = device
        self.pin_files = pin_files  # False: `pin` locks nothing (files off a tmpfs: see in_memory)
        self._buffers: list = []  # page-locked uint8 tensors, allocated on first use
        self._events: list = [None, None]  # the last DMA that used each buffer
        self._pinned: dict[int, int] = {}  # page-locked in place (`pin`): first page's address -> end address
        self._kept: set[int] = set()  # first pages of spans pinned with keep=True: `unpin` leaves them
        self.pinned_bytes = 0  # in all, for the stages' record and the tests

    # -- page-locking host memory where it lies ---------------------------------------------------------------
    @property
    def locks_in_place(self) -> bool:
        """Whether `pin` locks anything: files on a tmpfs, and a GPU to copy them to."""
        return self.pin_files and self.device == "cuda"

    def pin(self, value, read_only: bool = True, keep: bool = False) -> bool:
        """Page-lock the whole pages inside host tensor `value` (a memory-mapped file's), outside any turn, so that
        `upload`/`download` move them by DMA alone. `read_only`: the memory is only read from (a read-only shared
        mapping; the pages of a private, copy-on-write one are copied by the kernel before they are locked, so
        inputs are mapped shared: load_inputs). `keep`: locked for the process's
        life (inputs used by every case), not unlocked by `unpin`. False where nothing was locked: the copy is then
        staged."""
        import torch

        if not self.locks_in_place or not isinstance(value, torch.Tensor) \
                or value.device.type != "cpu" \
                or not value.is_contiguous() or _nbytes(value) < STREAM_MIN_BYTES:
            return False
        start = -(-value.data_ptr() // _PAGE) * _PAGE
        end = (value.data_ptr() + _nbytes(value)) // _PAGE * _PAGE
        if self._pinned_span(start, end) is not None:
            return True
        lib = _driver()
        if lib is not None and not self._pinned:
            torch.cuda.synchronize()  # the process's context exists and is current: registering needs it
        flags = _REGISTER_PORTABLE | (_REGISTER_READ_ONLY if read_only else 0)
        # The driver API, not the runtime's cudaHostRegister: a refused runtime call leaves its error behind as the
        # thread's last error, for torch's next kernel-launch check to raise as if the launch had failed.
        if lib is None or end <= start or lib.cuMemHostRegister_v2(start, end - start, flags) != 0:
            return False
        self._pinned[start] = end
        if keep:
            self._kept.add(start)
        self.pinned_bytes += end - start
        return True

    def unpin(self) -> None:
        """Unlock what `pin` locked (but what it was told to keep), once the device is done with it (waits for the
        device)."""
        spans = [start for start in self._pinned if start not in self._kept]
        if not spans:
            return
        import torch

        torch.cuda.synchronize()
        for start in spans:
            _driver().cuMemHostUnregister(start)
            del self._pinned[start]

    def _pinned_span(self, start: int, end: int) -> tuple[int, int] | None:
        """The locked range that holds the whole pages of [start, end), if one does."""
        first = -(-start // _PAGE) * _PAGE
        last = end // _PAGE * _PAGE
        for s, e in self._pinned.items():
            if s <= first and last <= e and first < last:
                return first, last
        return None

    def _direct(self, host, device, to_device: bool) -> bool:
        """Copy between flat uint8 tensors `host` and `device` by DMA where `host`'s pages are locked in place (the
        few bytes outside whole pages copied plainly); False where they are not."""
        base = host.data_ptr()
        span = self._pinned_span(base, base + host.numel())
        if span is None:
            return False
        a, b = span[0] - base, span[1] - base
        for lo, hi, non_blocking in ((a, b, True), (0, a, False), (b, host.numel(), False)):
            if hi > lo:
                if to_device:
                    device[lo:hi].copy_(host[lo:hi], non_blocking=non_blocking)
                else:
                    host[lo:hi].copy_(device[lo:hi], non_blocking=non_blocking)
        return True

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
        if self._direct(src, dst, to_device=True):
            return out
        for i, off in enumerate(range(0, dst.numel(), CHUNK_BYTES)):
            k = min(CHUNK_BYTES, dst.numel() - off)
            buf = self._buffer(i % 2)  # its previous DMA has finished
            buf[:k].copy_(src[off:off + k])
            dst[off:off + k].copy_(buf[:k], non_blocking=True)
            self._events[i % 2] = torch.cuda.Event()
            self._events[i % 2].record()
        return out

    # -- downloads -------------------------------------------------------------------------------------------
    def download(self, value, dst) -> None:
        """Device tensor `value`'s bytes into host uint8 tensor `dst` (e.g. a mapped output file). Where `dst` is
        pinned the copy may still be running on return: synchronise before reading `dst`."""
        src = _as_bytes(value.contiguous())
        if self.device != "cuda" or src.numel() < STREAM_MIN_BYTES:
            dst.copy_(src)
            return
        if self._direct(dst, src, to_device=False):
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


class _InBackground:
    """Page-locking work in a thread (the driver's calls release the GIL), e.g. while Python imports: `wait`
    joins it and raises what it raised; `cancel` stops it after the item in hand, so that a process does not exit
    while the driver is inside a call. Subclasses do the work in `_work`, looking at `_stop` between items."""

    def __init__(self, *args):
        self._failed: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=args, daemon=True, name=type(self).__name__)
        self._thread.start()

    def _run(self, *args) -> None:
        try:
            self._work(*args)
        except BaseException as exc:  # noqa: BLE001 - raised in the waiting thread
            self._failed.append(exc)

    def _work(self, *args) -> None:
        raise NotImplementedError

    def wait(self) -> None:
        self._thread.join()
        if self._failed:
            raise self._failed[0]

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join()


class PinInBackground(_InBackground):
    """`staging.pin` each of `tensors` in a thread. Nothing else may use `staging` until `wait` or `cancel`
    returned."""

    def __init__(self, staging: Staging, tensors: list):
        super().__init__(staging, tensors)

    def _work(self, staging: Staging, tensors: list) -> None:
        for t in tensors:
            if self._stop.is_set():
                return
            staging.pin(t)


def in_memory(*paths) -> bool:
    """Whether every one of `paths` lies on a tmpfs (its pages are memory already): only such files' pages are locked
    in place (measured on /dev/shm; a disk file system's pages under writeback are not worth locking, and untested)."""
    try:
        mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return False

    def kind(path) -> str:
        target, best, found = os.path.realpath(path), "", ""
        for m in mounts:
            point = m[1] if len(m) > 2 else ""
            if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                best, found = point, m[2]
        return found

    return all(kind(p) == "tmpfs" for p in paths)


def load_inputs(path: Path, shared: bool) -> dict:
    """A saved input set (prepare's torch.save of {"init": [...], "args": [...]}), its tensors mapped from the file,
    not read. `shared`: the "args" tensors mapped shared and read-only, for `Staging.pin` to lock where they lie (on a
    GPU, with files on a tmpfs: they are only uploaded from, never handed to forward); else torch's own private
    mapping, which the caller may write to (the CPU harness hands the saved tensors to forward as they are, and
    "init" always goes to a constructor).

    Why not torch's mapping for locking: it is private (copy-on-write), and the kernel copies a private mapping's file
    pages before it lets them be locked for long (a later write must not reach the locked page). On the H200 host
    each candidate and check process so held its own private copy of every input (3.4 GiB per process for 3 GiB of
    inputs), and locking them took ~0.6 s per GiB, against ~0.05 s for the output files, which are mapped shared."""
    import torch

    value = torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    if not shared or not isinstance(value, dict) or not isinstance(value.get("args"), (list, tuple)):
        return value
    # Where torch mapped the file: when every stored storage is found among the value's tensors, the lowest one is
    # at the first record, and each must then lie at a record of its own size. Anything else (a storage reached
    # some other way, e.g. through a set): torch's mapping it is (locking it copies, nothing worse).
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _tensors_in(value)
                if t.untyped_storage().nbytes()}
    records = _record_offsets(path)
    if not storages or len(storages) != len(records):
        return value
    base = min(storages) - min(records)
    if any(records.get(start - base) != nbytes for start, nbytes in storages.items()):
        return value
    fd = _open_regular(Path(path))
    try:
        mapped = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    with warnings.catch_warnings():  # read-only memory: only read, locked and uploaded, never handed to forward
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        flat = torch.frombuffer(mapped, dtype=torch.uint8)

    def remap(t):
        if not t.untyped_storage().nbytes():
            return t
        start = t.untyped_storage().data_ptr() - base
        return flat[start:start + t.untyped_storage().nbytes()].view(t.dtype).as_strided(
            t.size(), t.stride(), start // t.element_size() + t.storage_offset())

    try:  # the top-level tensors only: those alone are locked and uploaded; nested ones reach forward as they are
        return value | {"args": type(value["args"])(remap(a) if isinstance(a, torch.Tensor) else a
                                                    for a in value["args"])}
    except RuntimeError:  # a record not aligned to its dtype: torch's mapping it is
        return value


def _record_offsets(path: Path) -> dict[int, int]:
    """Where each stored storage's bytes begin in a torch.save file (a zip archive, records stored uncompressed),
    and their size: after each record's local header, whose name and extra field lengths may differ from the
    central directory's."""
    import zipfile

    offsets = {}
    try:
        with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
            for info in archive.infolist():
                if "/data/" not in info.filename or info.compress_type != zipfile.ZIP_STORED or not info.file_size:
                    continue
                f.seek(info.header_offset)
                header = f.read(30)
                if len(header) < 30 or header[:4] != b"PK\x03\x04":
                    return {}
                name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
                offsets[info.header_offset + 30 + name_len + extra_len] = info.file_size
    except (OSError, zipfile.BadZipFile):
        return {}
    return offsets


def _tensors_in(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


def _driver():
    """The CUDA driver library (libcuda, loaded in every process that uses the GPU), or None."""
    if not _driver_lib:
        import ctypes

        try:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
            lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
        except (OSError, AttributeError):
            lib = None
        _driver_lib.append(lib)
    return _driver_lib[0]


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _as_bytes(t):
    """A contiguous tensor's storage as a flat uint8 tensor (a view: no copy)."""
    import torch

    return t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)


# -- output files ------------------------------------------------------------------------------------------------

def output_file_limit(expected_bytes: int) -> int:
    """The most bytes a call's output file may hold, given what its outputs should take: room for outputs of a wrong
    shape, so that they are reported as such, and not for a candidate that would exhaust the check's memory."""
    return 2 * expected_bytes + (1 << 20)


def output_name(shape: str, seed: int | None = None) -> str:
    """The output file pair of a correctness call at `shape` and `seed`, or (no seed) of the timed call's spot check:
    the candidate writes, the controller preallocates and the check reads by this one name."""
    return f"timed-{shape}" if seed is None else f"{shape}-{seed}"


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


class OutputFiles(_InBackground):
    """The candidate's output files, made ready in a thread while its module loads: each expected NAME.bin
    allocated (a tmpfs page costs its allocation and zeroing on first use, ~0.6 s per GiB on the H200's host),
    mapped, and its pages locked in place by `staging` (Staging.pin, ~1 s per GiB with a dozen processes at it).
    Saving the outputs, which happens while they hold device memory, is then a record and a DMA per output.
    `staging` is the thread's alone until `wait` returned; outputs of another size than expected (a wrong shape)
    get a file of their size from `create_output_file`."""

    def __init__(self, outputs_dir: Path, sizes: dict[str, int], staging: Staging):
        self.staging = staging
        self._mapped: dict[str, object] = {}  # name -> flat uint8 tensor over NAME.bin's mapping
        super().__init__(outputs_dir, sizes)

    def _work(self, outputs_dir: Path, sizes: dict[str, int]) -> None:
        import torch

        for name, size in sizes.items():
            if self._stop.is_set():
                return
            try:
                fd = os.open(outputs_dir / f"{name}.bin", os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                continue  # something else in its place: create_output_file reports it
            try:
                if not size:
                    continue
                os.posix_fallocate(fd, 0, size)
                mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
            except OSError:
                continue  # no room, or a file system without fallocate: written the ordinary way at the end
            finally:
                os.close(fd)
            flat = torch.frombuffer(mapped, dtype=torch.uint8)  # keeps `mapped` alive
            self._mapped[name] = flat
            try:
                self.staging.pin(flat, read_only=False)
            except Exception:  # noqa: BLE001 - not locked: the download is staged; the device's errors show later
                pass

    def take(self, name: str, total: int):
        """NAME.bin's mapping if it was made ready with exactly `total` bytes, else None (after `wait`)."""
        flat = self._mapped.get(name)
        return flat if flat is not None and flat.numel() == total else None

    def close(self) -> None:
        """Unlock and unmap, once every download is done."""
        self.staging.unpin()
        self._mapped.clear()


def create_output_file(outputs_dir: Path, name: str, outs: list, extra: dict | None = None,
                       ready: OutputFiles | None = None):
    """Write NAME.json for device tensors `outs`, bring NAME.bin to its final size and map it with its pages in
    place (outside any turn: a first write into a fresh page costs a fault), or use the mapping `ready` made of it
    where that has the size. Returns each output's slice of the mapping, a host uint8 tensor for
    `Staging.download`."""
    import torch

    record = {"outs": [{"dtype": dtype_name(o.dtype), "shape": list(o.shape)} for o in outs]} | (extra or {})
    (outputs_dir / f"{name}.json").write_text(json.dumps(record))
    sizes = [_nbytes(o) for o in outs]
    total = sum(sizes)
    mapped = ready.take(name, total) if ready is not None and total else None
    if mapped is not None:
        return _slices(mapped, sizes)
    fd = os.open(outputs_dir / f"{name}.bin", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != total:
            os.ftruncate(fd, total)
        if not total:
            return [torch.empty(0, dtype=torch.uint8) for _ in outs]
        try:  # every page allocated before it is mapped
            os.posix_fallocate(fd, 0, total)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:  # writing into the mapping would die of SIGBUS instead
                raise OSError(exc.errno, f"no space for {total} bytes of outputs in {outputs_dir}") from None
            # a file system without fallocate: the pages are allocated as the download writes them
        mapped = mmap.mmap(fd, total, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(fd)  # the mapping stays valid
    return _slices(torch.frombuffer(mapped, dtype=torch.uint8), sizes)  # the tensor keeps `mapped` alive


def _slices(flat, sizes: list[int]) -> list:
    out, off = [], 0
    for size in sizes:
        out.append(flat[off:off + size])
        off += size
    return out


class OutputRecord:
    """A candidate's output file pair, checked before anything is read: its record parsed and bounded, its data
    file regular and of the size the record says, then mapped read-only with its pages in place (outside any turn).
    Raises ValueError saying what is wrong. The candidate's jail has ended when the check reads (its processes
    with it), so nothing can shrink the file under the mapping."""

    def __init__(self, outputs_dir: Path, name: str, max_bytes: int):
        import torch

        text = _read_small(outputs_dir / f"{name}.json", RECORD_MAX_BYTES)
        try:
            record = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested thousands deep
            raise ValueError(f"{name}.json is not JSON: {type(exc).__name__}") from None
        outs = record.get("outs") if isinstance(record, dict) else None
        if not isinstance(outs, list) or len(outs) > MAX_OUTPUTS:
            raise ValueError(f"{name}.json does not list the outputs")
        self.layout, self.sizes = [], []
        for o in outs:
            named = o.get("dtype") if isinstance(o, dict) else None
            dtype = getattr(torch, named, None) if isinstance(named, str) and named in DTYPE_BYTES else None
            shape = o.get("shape") if isinstance(o, dict) else None
            if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
                    type(s) is int and 0 <= s < 1 << 40 for s in shape) or math.prod(max(s, 1) for s in shape) >= 1 << 48:
                raise ValueError(f"{name}.json describes an output it cannot have: {str(o)[:200]}")
            self.layout.append((dtype, shape))
            self.sizes.append(math.prod(shape) * dtype.itemsize)
        total = sum(self.sizes)
        if total > max_bytes:
            raise ValueError(f"{name}.json describes {total} bytes of outputs, more than they can be ({max_bytes})")
        self.extra = {k: v for k, v in record.items() if k != "outs"}
        fd = _open_regular(outputs_dir / f"{name}.bin")
        try:
            size = os.fstat(fd).st_size
            if size != total:
                raise ValueError(f"{name}.bin holds {size} bytes, its record describes {total}")
            self._mapped = mmap.mmap(fd, total, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ) \
                if total else None
        finally:
            os.close(fd)

    def upload(self, staging: Staging) -> list:
        """The outputs as tensors on the staging's device (inside a turn on a GPU; on the CPU, copies)."""
        import torch

        if self._mapped is None:
            return [torch.empty(shape, dtype=dtype) for dtype, shape in self.layout]
        outs = []
        for (dtype, shape), part in zip(self.layout, _slices(self._flat(), self.sizes)):
            # The bytes are copied first (to the device, or on the CPU) and viewed as `dtype` there: the copy is
            # aligned, where the file's bytes for an output after an odd-sized one need not be.
            raw = staging.upload(part) if staging.device == "cuda" else part.clone()
            outs.append(raw.view(dtype).reshape(shape) if raw.numel() else torch.empty(shape, dtype=dtype,
                                                                                         device=raw.device))
        return outs

    def pin(self, staging: Staging) -> None:
        """Page-lock the mapped bytes for `upload` (outside the turn; see `Staging.pin`)."""
        if self._mapped is not None:
            staging.pin(self._flat(), read_only=True)

    def _flat(self):
        import torch

        with warnings.catch_warnings():  # read-only memory: what is made of it here is only read, or copied
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            return torch.frombuffer(self._mapped, dtype=torch.uint8)


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
