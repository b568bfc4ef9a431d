"""The kernel server's allocations during timed calls, carved from memory the referee owns.

A forward returns tensors torch allocated for it; copying them into the referee's buffers afterwards costs as much
as a memory-bound kernel itself (a second read and write of every output byte, inside the timed window). Instead
the server runs its calls under a torch MemPool whose segments come from an "arena": a shared pool (shared.py) the
referee created and exported. Outputs are then born in the referee's memory; the server only says where each one
is, and the referee checks that place itself (in the arena, the right size, no overlap) before it reads a byte.

This file runs in the candidate's process: nothing here is trusted, it only makes the honest path fast. A
candidate that points the referee at the wrong bytes gets those bytes judged.
"""

from __future__ import annotations

import bisect
import ctypes

from sandbox.harness.shared import ALIGN as VIEW_ALIGN

ALIGN = 2 << 20  # the caching allocator asks for segments of 2 MiB multiples; keep them page aligned

_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class Arena:
    """First-fit allocation of [base, base + size) for torch's caching allocator (through ctypes callbacks: it
    asks only when a segment is new, so the cost is per segment, not per tensor)."""

    def __init__(self, base: int, size: int):
        import torch

        self.base, self.size = int(base), int(size)
        self.free_spans: list[tuple[int, int]] = [(0, self.size)]  # (offset, length), sorted, coalesced
        self.used: dict[int, int] = {}  # offset -> length
        self._alloc_cb, self._free_cb = _ALLOC(self._alloc), _FREE(self._free)  # kept alive while torch holds them
        allocator = torch._C._cuda_customAllocator(ctypes.cast(self._alloc_cb, ctypes.c_void_p).value,
                                                   ctypes.cast(self._free_cb, ctypes.c_void_p).value)
        self.pool = torch.cuda.MemPool(allocator)

    def holds(self, ptr: int, nbytes: int) -> bool:
        return self.base <= ptr and ptr + nbytes <= self.base + self.size

    def allocating(self):
        """A context in which this thread's CUDA allocations come from the arena."""
        import torch

        return torch.cuda.use_mem_pool(self.pool)

    def offset_of(self, tensor) -> int | None:
        """Where a contiguous tensor's bytes start in the arena, if they all lie in it at an offset the referee
        accepts (shared.ALIGN); None otherwise (it is then copied)."""
        nbytes = tensor.numel() * tensor.element_size()
        ptr = tensor.data_ptr()
        if not nbytes or not tensor.is_contiguous() or not self.holds(ptr, nbytes) or (ptr - self.base) % VIEW_ALIGN:
            return None
        return ptr - self.base

    def _alloc(self, nbytes: int, device: int, stream) -> int | None:
        need = -(-max(int(nbytes), 1) // ALIGN) * ALIGN
        for i, (offset, length) in enumerate(self.free_spans):
            if length >= need:
                if length == need:
                    del self.free_spans[i]
                else:
                    self.free_spans[i] = (offset + need, length - need)
                self.used[offset] = need
                return self.base + offset
        return None  # torch frees the pool's cached segments and asks again, then raises OutOfMemoryError

    def _free(self, ptr, nbytes, device, stream) -> None:
        base = getattr(self, "base", None)  # None while the interpreter tears down
        if base is None or not ptr:
            return
        offset = int(ptr) - base
        length = self.used.pop(offset, None)
        if length is None:
            return
        i = bisect.bisect(self.free_spans, (offset, length))
        self.free_spans.insert(i, (offset, length))
        merged: list[tuple[int, int]] = []
        for o, n in self.free_spans:  # coalesce (the list is short: a few segments)
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((o, n))
        self.free_spans = merged
