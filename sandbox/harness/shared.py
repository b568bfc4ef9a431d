"""Memory shared between the trusted referee and the jailed kernel server, viewed by both as tensors.

The referee owns a pool, lays tensors out in it (`layout`) and sends the pool's file descriptor over an AF_UNIX
socket (socket.send_fds); the server, in another PID and IPC namespace, attaches to the fd and views the same bytes.
Nothing is copied or serialised: inputs are written once by the referee and outputs land where the referee reads
them. A file descriptor is the one handle that crosses namespaces, hence a memfd on the CPU and, on the GPU, the
CUDA VMM API's POSIX-fd shareable handles (legacy cudaIpc handles need a shared IPC namespace).

The server is untrusted, so the referee must never fault on what it did: a CPU pool's memfd is sealed against
shrinking (a truncated shared file would SIGBUS the referee on its next read), and `Pool.tensor` checks an entry
itself (dtype, alignment, extent) rather than trusting the span written in it.
"""

from __future__ import annotations

import fcntl
import math
import mmap
import os


ALIGN = 512  # bytes; every tensor's offset in a pool is a multiple of this (any dtype's, and vector loads', alignment)
# The dtypes a pool may hold, and their sizes (layout() needs no torch).
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
               "complex128": 16, "complex64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _entry(dtype: str, shape, strides) -> dict:
    """One tensor's dtype, shape, strides (in elements) and span in bytes, checked. Torch-free: the controller
    lays pools out without importing torch."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} cannot be shared")
    shape = tuple(int(s) for s in shape)
    if strides is None:  # contiguous
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    strides = tuple(int(s) for s in strides)
    if len(strides) != len(shape) or any(s < 0 for s in shape + strides):
        raise ValueError(f"bad shape {shape} or strides {strides}")
    numel = math.prod(shape)
    span = 0 if numel == 0 else (1 + sum((n - 1) * st for n, st in zip(shape, strides))) * DTYPE_BYTES[dtype]
    return {"dtype": dtype, "shape": shape, "strides": strides, "nbytes": span}


def layout(specs: list[tuple[str, tuple[int, ...], tuple[int, ...] | None]]) -> tuple[list[dict], int]:
    """Places tensors (dtype name, shape, strides in elements or None for contiguous) back to back, each at an
    offset aligned to ALIGN. Returns their entries ({"dtype","shape","strides","offset","nbytes"}, nbytes being the
    storage span the strided view touches) and the pool size they need."""
    entries, end = [], 0
    for dtype, shape, strides in specs:
        entry = _entry(dtype, shape, strides)
        entry["offset"] = _round_up(end, ALIGN)
        end = entry["offset"] + entry["nbytes"]
        entries.append(entry)
    return entries, _round_up(end, ALIGN)


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:  # cuda-python < 12.6
        from cuda import cuda as driver
    return driver


def _check(result, call: str):
    """cuda-python returns (CUresult, *outputs): raises unless CUDA_SUCCESS, else returns the output(s)."""
    err, out = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err == _driver().CUresult.CUDA_ERROR_OUT_OF_MEMORY:
        # The same error as torch's: the referee reports it as out of memory (run again alone beside others, the
        # task's error alone), not as a crash of the trusted side.
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory: {call} failed ({getattr(err, 'name', err)})")
    if err != _driver().CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed: {getattr(err, 'name', err)}")
    return out[0] if len(out) == 1 else out or None


class _DeviceBytes:
    """`nbytes` bytes of device memory at `ptr`, for torch.as_tensor. Always bytes: the interface has no typestr
    for bfloat16 or float8, so every dtype is a view of these, the same way as on the CPU."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "strides": None, "version": 3}


class Pool:
    """A block of memory shared between processes: on "cpu" a sealed memfd mapped MAP_SHARED; on "cuda[:N]" device
    memory from the CUDA VMM API (cuMemCreate exportable as a POSIX fd, mapped with cuMemAddressReserve, cuMemMap,
    cuMemSetAccess on both sides), its size rounded up to the allocation granularity."""

    def __init__(self, device: str, nbytes: int):
        self.device, self.nbytes = device, int(nbytes)
        if self.nbytes < 0:
            raise ValueError("negative pool size")
        self._closed = False
        self._fd = self._mmap = self._bytes = None  # CPU
        self._handle = self._ptr = None  # CUDA
        self._cuda = device.startswith("cuda")

    @classmethod
    def create(cls, device: str, nbytes: int) -> Pool:
        pool = cls(device, nbytes)
        try:
            if pool._cuda:
                drv, prop, size = pool._cuda_setup()
                pool._handle = _check(drv.cuMemCreate(size, prop, 0), f"cuMemCreate of {size / 2**30:.3g} GiB")
                pool._cuda_map(size)
            else:
                pool._fd = os.memfd_create("pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                os.ftruncate(pool._fd, _round_up(max(pool.nbytes, 1), mmap.PAGESIZE))
                fcntl.fcntl(pool._fd, fcntl.F_ADD_SEALS, _SEALS)
                pool._cpu_map()
        except BaseException:
            pool.close()
            raise
        return pool

    @classmethod
    def attach(cls, device: str, fd: int, nbytes: int) -> Pool:
        """Maps a pool another process created and exported; takes ownership of fd (on CUDA it is closed at once:
        the imported handle holds the allocation, and a held fd would keep it alive past cuMemRelease)."""
        pool = cls(device, nbytes)
        try:
            if pool._cuda:
                try:
                    drv, _, size = pool._cuda_setup()
                    pool._handle = _check(drv.cuMemImportFromShareableHandle(
                        fd, drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                        "cuMemImportFromShareableHandle")
                finally:
                    os.close(fd)
                pool._cuda_map(size)
            else:
                pool._fd = fd
                if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK == 0:
                    raise ValueError("pool fd is not sealed against shrinking")
                if os.fstat(fd).st_size < max(pool.nbytes, 1):
                    raise ValueError("pool fd is smaller than the pool")
                pool._cpu_map()
        except BaseException:
            pool.close()
            raise
        return pool

    def _cpu_map(self):
        import torch

        self._mmap = mmap.mmap(self._fd, os.fstat(self._fd).st_size)  # MAP_SHARED, read-write
        # Through a memoryview: tensors then hold an export of the mapping, so close() cannot unmap under them.
        self._bytes = torch.frombuffer(memoryview(self._mmap), dtype=torch.uint8)

    def _cuda_setup(self):
        """The driver, with torch's CUDA initialised and a current context (the device's primary one, which torch
        uses), the allocation properties and the mapped size."""
        import torch

        drv = _driver()
        torch.cuda.init()
        index = torch.device(self.device).index
        self._index = torch.cuda.current_device() if index is None else index
        _check(drv.cuInit(0), "cuInit")
        dev = _check(drv.cuDeviceGet(self._index), "cuDeviceGet")
        ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            ctx = _check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self._index
        prop.requestedHandleTypes = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        self._granularity = _check(drv.cuMemGetAllocationGranularity(
            prop, drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity")
        return drv, prop, _round_up(max(self.nbytes, 1), self._granularity)

    def _cuda_map(self, size: int):
        drv = _driver()
        ptr = _check(drv.cuMemAddressReserve(size, self._granularity, 0, 0), "cuMemAddressReserve")
        self._ptr, self._size, self._mapped = ptr, size, False
        _check(drv.cuMemMap(ptr, size, 0, self._handle, 0), "cuMemMap")
        self._mapped = True
        access = drv.CUmemAccessDesc()
        access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = self._index
        access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _check(drv.cuMemSetAccess(ptr, size, [access], 1), "cuMemSetAccess")

    def device_pointer(self) -> int:
        """The pool's first byte's device address (CUDA); its mapping spans `nbytes` rounded up to the granularity."""
        if not self._cuda or self._closed:
            raise ValueError("not an open device pool")
        return int(self._ptr)

    def export_fd(self) -> int:
        """A new fd for the pool, for the caller to send and then close."""
        if self._closed:
            raise ValueError("pool is closed")
        if not self._cuda:
            return os.dup(self._fd)
        drv = _driver()
        return int(_check(drv.cuMemExportToShareableHandle(
            self._handle, drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            "cuMemExportToShareableHandle"))

    def tensor(self, entry: dict):
        """The view `entry` (from `layout`, possibly from the other side) describes, checked against this pool."""
        import torch

        if self._closed:
            raise ValueError("pool is closed")
        e = _entry(entry["dtype"], entry["shape"], entry["strides"])
        offset = int(entry["offset"])
        if offset < 0 or offset % ALIGN or int(entry.get("nbytes", e["nbytes"])) != e["nbytes"]:
            raise ValueError(f"misaligned or inconsistent entry {entry}")
        if offset + e["nbytes"] > self.nbytes:
            raise ValueError(f"entry {entry} reaches past the pool's {self.nbytes} bytes")
        dtype = getattr(torch, e["dtype"])
        if e["nbytes"] == 0:
            return torch.empty_strided(e["shape"], e["strides"], dtype=dtype, device=self.device)
        if self._cuda:
            raw = torch.as_tensor(_DeviceBytes(int(self._ptr) + offset, e["nbytes"]), device=f"cuda:{self._index}")
        else:
            raw = self._bytes[offset:offset + e["nbytes"]]
        return raw.view(dtype).as_strided(e["shape"], e["strides"])

    def close(self) -> None:
        """Unmaps and frees (idempotent). On CUDA, waits for the device first: queued kernels may still use it. On
        the CPU, a mapping that tensors still view is unmapped only when the last of them goes."""
        if self._closed:
            return
        self._closed = True
        if self._cuda:
            drv = _driver()
            if self._ptr is not None:
                import torch

                torch.cuda.synchronize(self._index)
                if self._mapped:
                    _check(drv.cuMemUnmap(self._ptr, self._size), "cuMemUnmap")
                _check(drv.cuMemAddressFree(self._ptr, self._size), "cuMemAddressFree")
            if self._handle is not None:
                _check(drv.cuMemRelease(self._handle), "cuMemRelease")
            return
        self._bytes = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # tensors still view it: unmapped when the last one is freed
        if self._fd is not None:
            os.close(self._fd)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
