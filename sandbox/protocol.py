"""What the referee and the kernel server say to each other, and the names both sides and the controller share.

    referee (trusted: task code, inputs, outputs, clock)          kernel server (the candidate's process)
      {"op": "load", "file", "cls", "compile"}              ->    imports the module
      {"op": "pool", "name", "nbytes"} + one fd             ->    maps the shared buffers (sandbox/harness/shared.py)
      {"op": "arena", "pool"}                               ->    on a GPU: its calls' allocations come from that
                                                                  pool (sandbox/harness/arena.py)
      {"op": "slots", "name", "calls": [{"args", "outs"}]}  ->    remembers a set of calls' inputs and out buffers
      {"op": "build", "init", "seed", "dtype"}              ->    Model(*init) under that seed
      {"op": "call", "slots", "record", "profile"}          ->    forward on every call of that set, the device
                                                                  synchronised, the outputs placed
                                                          <-    {"ok": true, "launches", "outputs"} (+ "ops" when
                                                                  recorded)
      {"op": "tiny"}                                        ->    one tiny kernel and a synchronisation: the fixed
                                                                  cost of a call, which the clock subtracts
                                                          <-    {"ok": true}
      {"op": "exit"}

A call's "args" name, per positional argument, a buffer ({"pool", "entry"}) or a plain value; "outs" name a buffer
per output (used on the CPU). "outputs" say, per call and output, where it is: {"offset": n} in the arena (GPU) or
{"slot": true}, copied into its out buffer (CPU). The referee checks every place itself. Every answer it reads
goes through `receive`: bounded in size, depth and kind, and every malformation is a `ProtocolError`, never a
crash of the trusted side. Answers carry no numbers the referee believes: the time is the referee's own clock, the
outputs are bytes in memory it owns.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from enum import StrEnum

MAX_MESSAGE_BYTES = 1 << 20  # an answer's JSON; a failure's traceback is cut to fit long before this
MAX_FDS = 4
_HEADER = struct.Struct("!I")


class Stage(StrEnum):
    LOAD = "load"
    COMPILE = "compile"
    CORRECTNESS = "correctness"
    TIMING = "timing"
    DONE = "done"


class Verdict(StrEnum):
    PASS = "pass"
    LOAD_ERROR = "load_error"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    WRONG_OUTPUT = "wrong_output"
    WRONG_SHAPE = "wrong_shape"
    WRONG_DTYPE = "wrong_dtype"
    NAN_INF = "nan_inf"
    INPUT_MUTATED = "input_mutated"
    DEFERRED_WORK = "deferred_work"
    TIMED_OUTPUT_MISMATCH = "timed_output_mismatch"
    SANDBOX_VIOLATION = "sandbox_violation"
    TAMPERING = "tampering"
    LIBRARY_FALLBACK = "library_fallback"
    IMPOSSIBLE = "impossible"
    TIMING_MISMATCH = "timing_mismatch"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    PROCESS_LIMIT = "process_limit"
    DISK_LIMIT = "disk_limit"
    CPU_LIMIT = "cpu_limit"
    BACKEND_NOT_ALLOWED = "backend_not_allowed"
    PROTOCOL_ERROR = "protocol_error"
    L2_PERSISTENCE = "l2_persistence"


# What a kernel server may say about its own failure: a candidate can always fail itself, so these are believed
# only to fail it. Anything else it names is a protocol error.
SELF_REPORTED = frozenset({Verdict.LOAD_ERROR, Verdict.COMPILE_ERROR, Verdict.RUNTIME_ERROR, Verdict.WRONG_OUTPUT,
                           Verdict.WRONG_SHAPE, Verdict.WRONG_DTYPE, Verdict.SANDBOX_VIOLATION})
REQUESTS = frozenset({"load", "pool", "arena", "slots", "build", "call", "tiny", "exit"})
FAILURE_TEXT_CHARS = 4000  # of a self-reported failure's reason or traceback: untrusted text, kept short


class ProtocolError(Exception):
    """A message that is not what the protocol allows: too big, not JSON, nested too deep, the wrong kind."""


def send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes is past the limit of {MAX_MESSAGE_BYTES}")
    frame = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [frame[:_HEADER.size]], list(fds))
        sock.sendall(frame[_HEADER.size:])
    else:
        sock.sendall(frame)


def receive(sock: socket.socket, spin_s: float = 0.0) -> tuple[dict, list[int]]:
    """One message and the fds sent with it. EOFError when the other side closed; ProtocolError for anything
    malformed (the fds that came with it are closed). With `spin_s`, polls for that long before it blocks: a process
    woken from a blocking read after milliseconds of idling takes 0.1 ms or more to run, inside someone's clock."""
    spin(sock, spin_s)
    header, fds = _receive_exactly(sock, _HEADER.size, with_fds=True)
    try:
        (size,) = _HEADER.unpack(header)
        if size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"a message of {size} bytes announced, past the limit of {MAX_MESSAGE_BYTES}")
        body, _ = _receive_exactly(sock, size)
        return parse(body), fds
    except BaseException:
        for fd in fds:
            _close(fd)
        raise


def spin(sock: socket.socket, spin_s: float) -> bool:
    """Poll `sock` for up to `spin_s` seconds without sleeping: whether a message is there to read."""
    deadline = time.perf_counter() + spin_s
    while not select.select([sock], [], [], 0)[0]:
        if time.perf_counter() >= deadline:
            return False
    return True


def parse(body: bytes) -> dict:
    """A message's JSON object; ProtocolError for anything else (bad UTF-8, bad JSON, nesting past the parser's
    stack, a non-object, numbers past float range)."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"not a JSON message: {type(exc).__name__}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"a message must be a JSON object, not {type(value).__name__}")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number the protocol allows")


def _receive_exactly(sock: socket.socket, n: int, with_fds: bool = False) -> tuple[bytes, list[int]]:
    chunks, got, fds = [], 0, []
    while got < n:
        if with_fds and not got:
            data, more, flags, _ = socket.recv_fds(sock, n, MAX_FDS)
            fds += more
            if flags & socket.MSG_CTRUNC:
                for fd in fds:
                    _close(fd)
                raise ProtocolError(f"more than {MAX_FDS} file descriptors sent with one message")
        else:
            data = sock.recv(min(n - got, 1 << 16))
        if not data:
            for fd in fds:
                _close(fd)
            raise EOFError("the other side closed the connection")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks), fds


def answer_of(message: dict) -> dict:
    """A kernel server's answer, checked for form: {"ok": true, ...} or {"ok": false, "failure": {...}} whose
    failure names a self-reported verdict and a stage, with texts cut to FAILURE_TEXT_CHARS."""
    if message.get("ok") is True:
        return message
    failure = message.get("failure")
    if message.get("ok") is not False or not isinstance(failure, dict):
        raise ProtocolError("an answer is neither {\"ok\": true} nor a failure")
    verdict, stage = failure.get("verdict"), failure.get("stage")
    if not (isinstance(verdict, str) and isinstance(stage, str)) or verdict not in SELF_REPORTED or \
            stage not in Stage.__members__.values():
        raise ProtocolError(f"a failure with verdict {str(verdict)[:40]!r} and stage {str(stage)[:20]!r}, which the "
                            "kernel server never reports")
    texts = {k: str(failure.get(k, ""))[:FAILURE_TEXT_CHARS] for k in ("reason", "type", "traceback")}
    line = failure.get("line")
    return {"ok": False, "failure": {"verdict": Verdict(verdict), "stage": Stage(stage), **texts,
                                     "line": line if type(line) is int else None}}


def _close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
