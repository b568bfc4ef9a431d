"""Reading what a jailed process wrote (a result record, a log): bounded, never following a link or blocking on a
FIFO, and None for anything that is not a small regular file holding a JSON object. A candidate can write to the
folders these files are in; nothing it writes there may crash the trusted side."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

MAX_RESULT_BYTES = 4 << 20


def read_text(path: Path, limit: int) -> str | None:
    """A file the candidate could have written to: never follow a link, never block on a FIFO, never read more
    than `limit` bytes. None if it is not a small regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return os.read(fd, limit).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_result(path: Path) -> dict | None:
    """A result file's JSON object, or None."""
    text = read_text(path, MAX_RESULT_BYTES)
    try:
        data = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):  # a candidate can write JSON nested deeper than the parser's stack
        return None
    return data if isinstance(data, dict) else None
