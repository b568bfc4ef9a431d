"""Faster load_inline builds: torch's C++ headers precompiled once, by trusted code, and only read in the jails.

Most of a load_inline build is g++ parsing torch/extension.h for the binding file (about 30 s of a core, every
candidate). GCC takes a precompiled header (`extension.h.gch`) found beside the header it includes when the
compile's flags match those it was built with, and silently ignores it otherwise. So it is built here, outside any
jail, with the flags load_inline itself uses (torch's own routine for its `use_pch` option), before the first
candidate that builds with load_inline is jailed; the jails mount torch read-only, so no candidate can change what
another one compiles against. In the jail, torch's own handling of that file is switched off (`keep_trusted_pch`):
load_inline deletes it when `use_pch` is off and rebuilds it when the flags differ, and either would fail on the
read-only mount. CUDA sources (nvcc) are not helped.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from pathlib import Path

_lock = threading.Lock()
_status: str | None = None  # this process's answer, once known


def pch_paths() -> tuple[Path, Path]:
    """Where torch keeps its precompiled extension.h, and the signature of the flags it was built with."""
    import torch.utils.cpp_extension as ext

    include = Path(ext._TORCH_PATH) / "include" / "torch"
    return include / "extension.h.gch", include / "extension.h.sign"


def build_lock_path() -> Path:
    """The lock that workers take to build the header: in the host's temporary folder, which no jail mounts (a lock
    beside the header could be taken, read-only, by a jailed candidate and held)."""
    return Path(tempfile.gettempdir()) / f"appliance-torch-pch-{os.getuid()}.lock"


def ensure_torch_pch() -> str:
    """Torch's extension.h precompiled for load_inline's default flags, built if missing or stale. Trusted side
    only (never inside a jail). Returns what happened, for the evidence: "ready", "built in N s" or "skipped: why".
    Threads of one process, and processes (a worker per GPU), build it one at a time."""
    global _status
    with _lock:
        if _status is not None:
            return _status
        status = _ensure()
        _status = "ready" if status.startswith("built") else status  # what every later evaluation finds
        return status


def _ensure() -> str:
    import torch.utils.cpp_extension as ext

    build = getattr(ext, "_check_and_build_extension_h_precompiler_headers", None)
    if build is None or not ext.IS_LINUX or not ext.check_compiler_is_gcc(ext.get_cxx_compiler()):
        return "skipped: this torch or compiler has no precompiled headers (GCC on Linux only)"
    gch, sign = pch_paths()
    if not os.access(gch.parent, os.W_OK):
        return f"skipped: {gch.parent} is not writable by the appliance (build it once as its owner)"
    t0 = time.perf_counter()
    before = gch.stat().st_mtime_ns if gch.exists() else None
    with open(build_lock_path(), "w") as lock:  # another worker may be building it: wait, then find it done
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            build(None, None)  # torch's routine: builds only when the file is missing or its flags changed
        except (RuntimeError, OSError) as exc:
            gch.unlink(missing_ok=True)  # never leave a half-written header for a jail to read
            sign.unlink(missing_ok=True)
            return f"skipped: building it failed ({str(exc)[:200]})"
    if before is not None and gch.stat().st_mtime_ns == before:
        return "ready"
    return f"built in {time.perf_counter() - t0:.0f} s"


def keep_trusted_pch() -> None:
    """In the jail, before the candidate is imported: torch leaves the trusted precompiled header alone (it would
    delete or rebuild it, which the read-only mount refuses). GCC still decides per compile whether it fits."""
    import torch.utils.cpp_extension as ext

    ext.remove_extension_h_precompiler_headers = lambda: None
    ext._check_and_build_extension_h_precompiler_headers = lambda *args, **kwargs: None
