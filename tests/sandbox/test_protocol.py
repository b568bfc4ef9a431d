"""The referee's reader of the kernel server's answers: every malformation is a named error, never a crash.

Fuzzed with random bytes and with adversarial records (deep nesting, huge numbers, wrong kinds, forged verdicts),
both at the parser and through a real socket pair into the referee's Link."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import threading

import pytest

from sandbox import protocol
from sandbox.harness.referee import Gone, Link, Rejected
from sandbox.protocol import ProtocolError, Stage, Verdict

ADVERSARIAL = [
    b"", b"\xff\xfe", b"null", b"[]", b"1e999999", b'"ok"', b"NaN", b'{"ok": NaN}', b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b'{"ok": 1}', b'{"ok": "true"}', b'{"ok": false}',
    b'{"ok": false, "failure": []}', b'{"ok": false, "failure": {"verdict": "pass", "stage": "done"}}',
    b'{"ok": false, "failure": {"verdict": "memory_limit", "stage": "timing"}}',
    b'{"ok": false, "failure": {"verdict": "wrong_output", "stage": "nowhere"}}',
    b'{"ok": false, "failure": {"verdict": "runtime_error", "stage": "timing", "reason": {"x": 1}, "line": "7"}}',
]


def _answer(body: bytes) -> dict:
    return protocol.answer_of(protocol.parse(body))


@pytest.mark.parametrize("body", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_an_adversarial_answer_is_a_protocol_error_or_a_checked_failure(body):
    try:
        answer = _answer(body)
    except ProtocolError:
        return
    assert answer["ok"] is False  # only a well-formed self-reported failure gets through, its texts made strings
    failure = answer["failure"]
    assert failure["verdict"] in protocol.SELF_REPORTED and isinstance(failure["reason"], str)
    assert failure["line"] is None or type(failure["line"]) is int


def test_random_bytes_never_get_past_the_parser_as_anything_but_an_answer_or_protocol_error():
    rng = random.Random(24)
    pieces = [b"{", b"}", b"[", b"]", b'"ok"', b":", b",", b"true", b"false", b'"failure"', b'"verdict"', b"1e400",
              b'"runtime_error"', b'"timing"', b"\\u0000", b"\xc3", b"-", b"0"]
    for _ in range(3000):
        body = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40))) if rng.random() < 0.7 else \
            os.urandom(rng.randrange(0, 64))
        try:
            answer = _answer(body)
        except ProtocolError:
            continue
        assert answer["ok"] in (True, False)


def test_a_self_reported_failure_keeps_its_verdict_and_is_cut_short():
    body = json.dumps({"ok": False, "failure": {"verdict": "runtime_error", "stage": "correctness",
                                                "reason": "x" * 100_000, "line": 3}}).encode()
    failure = _answer(body)["failure"]
    assert failure["verdict"] == Verdict.RUNTIME_ERROR and failure["stage"] == Stage.CORRECTNESS
    assert len(failure["reason"]) == protocol.FAILURE_TEXT_CHARS and failure["line"] == 3


def _serve(sock: socket.socket, frames: list[bytes], fds: int = 0) -> None:
    """A hostile kernel server: reads one request, then writes raw frames."""
    try:
        protocol.receive(sock)
        for frame in frames:
            if fds:
                spare = [os.open("/dev/null", os.O_RDONLY) for _ in range(fds)]
                socket.send_fds(sock, [frame[:1]], spare)
                sock.sendall(frame[1:])
                for fd in spare:
                    os.close(fd)
            else:
                sock.sendall(frame)
    except OSError:
        pass
    finally:
        sock.close()


def _frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


HOSTILE_FRAMES = {
    "announces 4 GiB": [struct.pack("!I", 0xFFFFFFFF)],
    "deep JSON": [_frame(b"[" * 300_000 + b"]" * 300_000)],
    "forged verdict": [_frame(b'{"ok": false, "failure": {"verdict": "pass", "stage": "done"}}')],
    "half a header then gone": [b"\x00\x00"],
    "half a body then gone": [struct.pack("!I", 100) + b'{"ok":'],
    "a list": [_frame(b"[1, 2, 3]")],
}


@pytest.mark.parametrize("name", sorted(HOSTILE_FRAMES))
def test_the_referee_link_turns_every_hostile_answer_into_gone_or_rejected(name):
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    server = threading.Thread(target=_serve, args=(theirs, HOSTILE_FRAMES[name]))
    server.start()
    with pytest.raises((Gone, Rejected)) as caught:
        Link(ours).ask({"op": "empty"}, Stage.TIMING)
    server.join()
    if isinstance(caught.value, Rejected):
        assert caught.value.verdict == Verdict.PROTOCOL_ERROR


def test_descriptors_sent_with_an_answer_are_closed_and_too_many_are_a_protocol_error():
    before = len(os.listdir("/proc/self/fd"))
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    server = threading.Thread(target=_serve, args=(theirs, [_frame(b'{"ok": true}')], protocol.MAX_FDS + 3))
    server.start()
    with pytest.raises(Rejected):
        Link(ours).ask({"op": "empty"}, Stage.TIMING)
    server.join()
    ours.close()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_a_silent_server_is_gone_after_the_timeout():
    ours, theirs = socket.socketpair()
    ours.settimeout(0.3)
    with pytest.raises(Gone, match="did not answer in time"):
        Link(ours).ask({"op": "empty"}, Stage.TIMING)
    theirs.close()


@pytest.mark.parametrize("failure", [{"verdict": ["x"], "stage": "load"}, {"verdict": "runtime_error", "stage": {}},
                                     {"verdict": {"a": 1}, "stage": ["load"]}, {"verdict": 1.5, "stage": None}])
def test_a_failure_of_unhashable_or_odd_kinds_is_a_protocol_error_not_a_crash(failure):
    """Found by review: a list as the verdict made the membership test raise TypeError, which crashed the
    referee (and was charged to the infrastructure)."""
    with pytest.raises(ProtocolError):
        _answer(json.dumps({"ok": False, "failure": failure}).encode())


# --- where a server says it put the outputs ---------------------------------------------------------------------


class _Calls:
    """What `_outputs` reads of a Slots: how many calls, their outputs' dtypes and shapes, their out buffers."""

    def __init__(self, count: int, outputs: list[dict]):
        import torch

        self.count, self.outputs = count, outputs
        self._outs = [[torch.zeros(o["shape"], dtype=getattr(torch, o["dtype"])) for o in outputs]
                      for _ in range(count)]

    def outs(self, j: int) -> list:
        return self._outs[j]


@pytest.fixture
def arena():
    from sandbox.harness.referee import Arena
    from sandbox.harness.shared import Pool

    a = Arena(Pool.create("cpu", 1 << 16))
    yield a
    a.close()


def _placed(calls, arena, outputs):
    from sandbox.harness.referee import _outputs

    return _outputs(calls, arena, {"ok": True, "outputs": outputs}, Stage.TIMING)


def test_outputs_placed_in_the_arena_are_read_there_and_slots_are_the_calls_own(arena):
    calls = _Calls(2, [{"dtype": "float32", "shape": [4, 8]}])
    views = _placed(calls, arena, [[{"offset": 0}], [{"slot": True}]])
    views[0][0].fill_(3.0)
    assert float(arena.pool.tensor({"dtype": "float32", "shape": [1], "strides": None, "offset": 0})) == 3.0
    assert views[1][0] is calls.outs(1)[0]


@pytest.mark.parametrize("outputs, words", [
    ([[{"offset": 0}], [{"offset": 0}]], "share memory"),  # one output for two calls: only the last is right
    ([[{"offset": 0}], [{"offset": 512}]], "share memory"),  # 512 bytes into the first's 4096: shared
    ([[{"offset": 1 << 16}], [{"slot": True}]], "outside the arena"),
    ([[{"offset": 100}], [{"slot": True}]], "outside the arena"),  # misaligned
    ([[{"offset": -512}], [{"slot": True}]], "outside the arena"),
    ([[{"offset": 0.0}], [{"slot": True}]], "placed an output at"),
    ([[{"offset": True}], [{"slot": True}]], "placed an output at"),
    ([[{"offset": 0, "slot": True}], [{"slot": True}]], "placed an output at"),
    ([[{"slot": 1}], [{"slot": True}]], "placed an output at"),
    ([[{"slot": True}]], "every output of every call"),
    ([[{"slot": True}], []], "every output of every call"),
    ([[{"slot": True}], "x"], "every output of every call"),
    ("everywhere", "every output of every call"),
])
def test_an_output_placed_where_the_referee_cannot_trust_it_is_rejected(arena, outputs, words):
    calls = _Calls(2, [{"dtype": "float32", "shape": [4, 256]}])  # 4096 bytes each
    with pytest.raises(Rejected) as info:
        _placed(calls, arena, outputs)
    assert words in info.value.reason
    assert info.value.verdict == ("wrong_output" if words == "share memory" else "protocol_error")


def test_without_an_arena_only_out_buffers_are_places(arena):
    calls = _Calls(1, [{"dtype": "float32", "shape": [4]}])
    with pytest.raises(Rejected, match="placed an output at"):
        _placed(calls, None, [[{"offset": 0}]])


def test_two_outputs_of_one_call_may_share_bytes(arena):
    """Only other calls' outputs are a threat (one buffer reused across calls); one call's outputs are its own."""
    calls = _Calls(1, [{"dtype": "float32", "shape": [4]}, {"dtype": "float32", "shape": [4]}])
    views = _placed(calls, arena, [[{"offset": 0}, {"offset": 0}]])
    assert views[0][0].data_ptr() == views[0][1].data_ptr()
