"""Python source parsed with `ast`, one thread at a time.

CPython 3.11 and 3.12 can fail with "SystemError: AST constructor recursion depth mismatch" when threads call
ast.parse at once (the converter's depth counter is shared); the search loop asks its proposers from several
threads, and one such error cost a CI run a proposal. Every parse in the appliance goes through here.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
