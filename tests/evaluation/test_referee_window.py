"""The referee's window (issue 24, deliver 2): a timed call's inputs reach memory the kernel server can map only once
the referee's clock runs, so nothing can be computed on them ahead of the window (a server that reads the shared
pool while the referee draws the next batch's inputs would otherwise have the answers ready before the request).

Driven with the real referee and the real kernel server's code over a socket pair, on the CPU and the GPU. The
server runs in a thread of the test and serves the task's own Model (trusted code: the referee runs it too), so the
test can look at the pool through the server's own mapping, at the moment the referee's clock is read."""

from __future__ import annotations

import socket
import threading

import pytest


def _serve(sock: socket.socket, server) -> None:
    from sandbox import protocol
    from sandbox.harness.server import Failure

    while True:
        try:
            message, fds = protocol.receive(sock)
        except (EOFError, OSError):
            return
        if message.get("op") == "exit":
            return
        try:
            answer = server.handle(message["op"], message, fds)
        except Failure as f:
            answer = f.answer()
        protocol.send(sock, answer)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def session(request, softmax_task, tmp_path):
    """(referee, server, its first shape) with the task's Model loaded and built in the server."""
    from appliance.tasks import load_task
    from sandbox import protocol
    from sandbox.harness.provenance import Launches
    from sandbox.harness.referee import Link, Referee
    from sandbox.harness.server import Server
    from sandbox.harness.task_code import load_task as load_task_code

    device = request.param
    task = load_task(softmax_task)
    shapes = task.shapes("small" if device == "cpu" else "full")
    spec = {"device": device, "dtype": task.manifest.dtype, "seeds": [0], "timing_budget_s": 0.05,
            "shapes": [vars(sh) for sh in shapes], "tolerances": task.tolerances(),
            "role": "baselines", "calibration": {},
            "implementations": [{"name": "eager", "file": str(softmax_task), "cls": "Model"}],
            "task_file": str(softmax_task), "task_display": str(softmax_task), "result": str(tmp_path / "r.json")}
    ours, theirs = socket.socketpair()
    server = Server(device, Launches())  # (not installed: nothing of the test process is patched)
    thread = threading.Thread(target=_serve, args=(theirs, server), daemon=True)
    thread.start()
    referee = Referee(spec, Link(ours))
    referee.task = load_task_code(spec)
    sh = referee._shape(spec["shapes"][0])
    referee.link.ask({"op": "load", "file": str(softmax_task), "cls": "Model"}, "load")
    referee._build(sh, 0)
    yield referee, server, sh
    protocol.send(ours, {"op": "exit"})
    thread.join(10)
    ours.close()
    theirs.close()


def _inputs_the_server_sees(server, name: str) -> list:
    return [[a.clone() for a in args if hasattr(a, "clone")] for args in server.slots[name].args]


def _draw(referee, sh, seed: int) -> list:
    from sandbox.harness.task_code import make_inputs

    return [a for a in make_inputs(referee.spec, referee.task, sh["shape"], seed) if hasattr(a, "clone")]


def _equal(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_drawn_inputs_reach_the_servers_mapping_only_when_staged(session):
    from sandbox.harness.referee import Slots
    from sandbox.harness.task_code import make_inputs

    referee, server, sh = session
    slots = Slots(referee.link, referee.device, "t", sh, 2)
    args = make_inputs(referee.spec, referee.task, sh["shape"], 7)
    slots.fill(1, args)
    drawn = [a for a in args if hasattr(a, "clone")]
    assert not _equal(_inputs_the_server_sees(server, "t")[1], drawn)  # drawn in the referee's own memory
    slots.stage()
    referee.sync()
    assert _equal(_inputs_the_server_sees(server, "t")[1], drawn)
    slots.close()


def test_the_clock_runs_before_a_timed_batchs_inputs_reach_the_server(session):
    """What the server can see when the window opens (the referee's first clock reading in a batch) holds none of
    the batch's inputs; when it closes, it holds all of them."""
    from sandbox.harness.referee import Slots

    referee, server, sh = session
    slots = Slots(referee.link, referee.device, "t", sh, 3)
    cal = {"tiny_ms": 0.0, "tiny_read_ms": 0.0, "stage_ms": None}
    referee._batch(slots, 3, cal)  # a batch before: the pool holds inputs (the last batch's), not only zeros
    readings, real_clock = [], referee.clock

    def clock() -> float:
        readings.append(_inputs_the_server_sees(server, "t"))
        return real_clock()

    referee.clock = clock
    per_call, _, seeds, *_ = referee._batch(slots, 3, cal)
    referee.clock = real_clock
    drawn = [_draw(referee, sh, seed) for seed in seeds]
    assert not any(_equal(seen, d) for seen, d in zip(readings[0], drawn)), "inputs visible before the clock ran"
    assert all(_equal(seen, d) for seen, d in zip(readings[-1], drawn))
    assert per_call >= 0.0
    assert referee._staged and referee._staged[-1] > 0.0  # our copy was timed, inside the window
    slots.close()


def test_what_is_taken_off_a_candidates_window_is_never_more_than_beside_the_trusted_server(session):
    """The trusted server's calibration caps the fixed cost, our copy and our read taken off, and its batch size
    is the least K: a server that dawdles in the calibration or in its estimate calls gains nothing by it."""
    referee, server, sh = session
    trusted = {"tiny_ms": 1e-4, "read_ms": 0.0, "stage_ms": 0.0, "calls_per_batch": 60}
    summary, _ = referee._timed(sh, check=False, calibration=trusted)
    if referee.device == "cuda":
        assert summary["tiny_ms"] == pytest.approx(1e-4)  # our own measured round trip is larger: the cap holds
    if referee.device == "cuda":  # more than its own estimate asks for on this small shape
        assert summary["calls_per_batch"] >= 60
    else:  # on the CPU (the interpreter) K is the server's own: eager's K made interpreted batches take seconds
        assert summary["calls_per_batch"] < 60
        # ... and each call gets no more of the fixed cost off than one of the trusted server's 60 did
        assert summary["tiny_ms"] <= round(1e-4 * summary["calls_per_batch"] / 60, 4) + 1e-9  # (rounded to 1e-4)
    # The fixed cost of a batch taken off is no more than the trusted server's (none given here) plus the slack.
    from sandbox.harness.referee import FIXED_SLACK, UNCALIBRATED

    def capped(summary: dict, trusted_fixed: float) -> None:
        if len(summary["batch_sizes"]) == 1:  # one size (K = 1): the calibrated round trip, capped as above
            assert summary["fixed_ms"] == summary["tiny_ms"]
            return
        small, large = summary["batch_sizes"]
        small_window = summary["large_batch_ms"] * small / large  # (the smaller batch as the larger give it)
        assert summary["fixed_cap_ms"] <= trusted_fixed + FIXED_SLACK * small_window + 2e-4
        assert summary["fixed_ms"] <= summary["fixed_cap_ms"] + 1e-4  # (both rounded to 1e-4)

    capped(summary, 0.0)
    uncalibrated, _ = referee._timed(sh, check=False, calibration=dict(UNCALIBRATED))
    assert uncalibrated["tiny_ms"] == 0.0
    capped(uncalibrated, 0.0)


def test_the_fixed_cost_of_a_batch_is_the_intercept_of_the_line_through_two_batch_sizes():
    from sandbox.harness.referee import _fixed_cost, _median_windows

    # 3 ms per batch and 2 ms per call, with noise that the medians ignore
    nets = [(2, 7.0), (4, 11.0), (2, 7.1), (4, 10.9), (2, 6.9), (4, 11.0), (2, 50.0), (4, 11.1)]
    assert _fixed_cost(_median_windows(nets)) == pytest.approx(3.0, abs=0.2)


@pytest.mark.parametrize("stalled", ["every", "two_of_three"])
def test_a_server_that_stalls_its_smaller_batches_gains_nothing_by_it(session, stalled, monkeypatch):
    """A batch's fixed cost is the intercept of the line through the windows of batches of K/2 and K calls. A
    server that stalls its smaller batches (it sees how many calls it is asked for) raises the intercept and
    flattens the line: taken at its word, its calls would cost next to nothing. What comes off is capped by the
    trusted server's intercept plus a slack that no stall can raise, and the larger size's median is reported:
    stalling two small batches in three (more than half of them, fewer than half of all batches) once drove the
    median of both sizes mixed to 0 (an attacker's review)."""
    import time

    import sandbox.harness.referee as referee_module

    # On the CPU, K comes from the server's own estimate: on a loaded host (CI, 2 cores) a slow estimate gave
    # batches of one call, one size, and no line. Longer batches keep K >= 2 whatever the load, and more of them
    # keep each size's median clear of a hiccup (with 2 large batches, one slow one moved the line as a stall does).
    monkeypatch.setitem(referee_module.BATCH_TARGET_MS, "cpu", 100.0)
    monkeypatch.setitem(referee_module.MIN_BATCHES, "cpu", 15)
    referee, server, sh = session
    honest, trusted = referee._timed(sh, check=False)  # (as the trusted server: its own intercept)
    stall_s = 0.02
    handle = server.handle
    small_batches = []

    def stalling(op, message, fds):
        if op == "call" and message.get("count", 1 << 30) < len(server.slots[message["slots"]].args):
            small_batches.append(1)
            if stalled == "every" or len(small_batches) % 3:
                time.sleep(stall_s)
        return handle(op, message, fds)

    server.handle = stalling
    try:
        cheat, _ = referee._timed(sh, check=False, calibration=trusted)
    finally:
        server.handle = handle
    small, large = cheat["batch_sizes"]
    # The attack is real: the line alone would have put its calls at (nearly) nothing ...
    line_per_call = (cheat["large_batch_ms"] - cheat["small_batch_ms"]) / (large - small)
    assert line_per_call < 0.5 * honest["median_ms"]
    assert cheat["own_fixed_ms"] > trusted["fixed_ms"] + stall_s * 1e3 / 2
    # ... and the cap takes it away: its calls read as an honest server's would in the same run (its larger
    # batches, which it did not stall, less the trusted fixed cost), give or take the slack ...
    assert cheat["fixed_ms"] <= cheat["fixed_cap_ms"] + 1e-4
    as_honest = (cheat["large_batch_ms"] - trusted["fixed_ms"]) / large
    assert cheat["median_ms"] >= as_honest - referee_module.FIXED_SLACK * cheat["large_batch_ms"] / large - 1e-4
    # ... and near what it reads honestly, in separate runs (loose: on a loaded 2-core host two honest timings of
    # the same server differ by a fifth or more, and a 0.03 ms call read 0.72 of the other once).
    again, _ = referee._timed(sh, check=False)
    assert cheat["median_ms"] >= 0.6 * min(honest["median_ms"], again["median_ms"])


def test_a_fixed_cost_above_the_cap_weighs_one_kth_on_each_reported_call(session, monkeypatch):
    """An honest server slower to answer than the trusted one (on an H100, Triton servers' 1.3-1.5 ms a batch against
    eager's 0.9) keeps the excess over the cap in every batch. The larger size's median is reported, where the
    excess weighs 1/K on each call, not the smaller's, where it weighs 2/K (1.28x do_bench on rmsnorm, K = 4)."""
    import time

    import sandbox.harness.referee as referee_module

    monkeypatch.setitem(referee_module.BATCH_TARGET_MS, "cpu", 100.0)  # K >= 2 on a loaded host (as above)
    monkeypatch.setitem(referee_module.MIN_BATCHES, "cpu", 15)
    referee, server, sh = session
    _, trusted = referee._timed(sh, check=False)
    handle, stall_s = server.handle, 0.02

    def slow_to_answer(op, message, fds):
        if op == "call":
            time.sleep(stall_s)
        return handle(op, message, fds)

    server.handle = slow_to_answer
    try:
        slower, _ = referee._timed(sh, check=False, calibration=trusted)
    finally:
        server.handle = handle
    k = slower["calls_per_batch"]
    assert slower["batch_sizes"] == [k // 2, k] and k >= 2
    assert slower["own_fixed_ms"] > slower["fixed_ms"] + 0.5 * stall_s * 1e3  # the excess is left in the batches
    per_call = {size: (slower[f"{name}_batch_ms"] - slower["fixed_ms"]) / size
                for size, name in ((k // 2, "small"), (k, "large"))}
    assert slower["median_ms"] == pytest.approx(per_call[k], rel=1e-3, abs=2e-4)
    assert slower["median_ms"] < per_call[k // 2]


def _timed_as(referee, server, sh, fixed_s: float, work_s: float, stall_small_s: float = 0.0,
              calibration: dict | None = None, estimate_s: float = 0.0):
    """The referee timing a server modelled by sleeps: `fixed_s` a batch and `work_s` a call, its smaller batches
    stalled `stall_small_s` more, and its single-call estimate batches taking at least `estimate_s` (K is picked
    from them; on the CPU nothing floors it)."""
    import time

    handle = server.handle

    def serving(op, message, fds):
        if op == "call":
            count = message.get("count", 1)
            alone = len(server.slots[message["slots"]].args) == 1
            time.sleep(max(fixed_s + work_s * count, estimate_s if alone else 0.0))
            if stall_small_s and count < len(server.slots[message["slots"]].args):
                time.sleep(stall_small_s)
        return handle(op, message, fds)

    server.handle = serving
    try:
        return referee._timed(sh, check=False, calibration=calibration)
    finally:
        server.handle = handle


def test_stalling_every_small_batch_does_not_lift_the_bounds_on_the_fixed_cost(session, monkeypatch):
    """An attacker's review of reporting the larger size: a server whose fixed cost (25 ms) is under the trusted
    server's (50 ms: the cap it gets) stalled every small batch until their median window passed the large one's.
    The half-window bound, then taken from min(windows), rose to half the LARGE window, and 5 ms calls read as
    ~4 ms. The bounds now come from the smaller batch as the larger batches give it, which no stall raises."""
    import sandbox.harness.referee as referee_module

    work_ms, own_fixed_s = 5.0, 0.025
    monkeypatch.setitem(referee_module.BATCH_TARGET_MS, "cpu", 280.0)  # K = 8 or 9 for the attacker (below)
    monkeypatch.setitem(referee_module.MIN_BATCHES, "cpu", 21)  # (medians clear of a loaded host's hiccups)
    referee, server, sh = session
    if referee.device != "cpu":
        pytest.skip("work modelled by sleeps: the CPU path")
    _, trusted = _timed_as(referee, server, sh, 0.050, work_ms / 1e3)
    assert trusted["fixed_ms"] > 1e3 * (own_fixed_s + 0.050) / 2  # the cap is above the attacker's own fixed cost
    cheat, _ = _timed_as(referee, server, sh, own_fixed_s, work_ms / 1e3, stall_small_s=0.08, calibration=trusted,
                         estimate_s=0.0315)
    k = cheat["calls_per_batch"]
    assert cheat["batch_sizes"] == [k // 2, k] and k in (8, 9)  # (8 where the host is loaded enough)
    assert cheat["small_batch_ms"] > cheat["large_batch_ms"]  # the attack ran: small batches stalled past the large
    assert cheat["fixed_ms"] <= 0.5 * cheat["large_batch_ms"] * (k // 2) / k + 1e-4
    assert cheat["median_ms"] >= work_ms  # no call reads under its work


@pytest.mark.xfail(strict=True, reason="known gap: a server whose own fixed cost F is far under the trusted servers' "
                   "(F < K t / 3, the cap above F) and that stalls every small batch reads down to 3/4 (t + F/K): the "
                   "windows cannot tell it from an honest server above the cap (the slower-size rule let it read lower)")
def test_a_stalling_server_with_a_fixed_cost_far_under_the_trusted_ones_reads_no_call_under_its_work(session,
                                                                                                     monkeypatch):
    """A second attacker's review: the previous test's attack with no fixed cost of the server's own (the trusted
    server's 50 ms). On the GPU the trusted servers' intercepts are the same protocol's round trip as a candidate's
    (0.68-0.76 ms on an H100 at 60 us kernels), so the gap there is the difference between them over K."""
    import sandbox.harness.referee as referee_module

    work_ms = 5.0
    monkeypatch.setitem(referee_module.BATCH_TARGET_MS, "cpu", 280.0)  # K = 8 or 9 for the attacker (below)
    monkeypatch.setitem(referee_module.MIN_BATCHES, "cpu", 21)
    referee, server, sh = session
    if referee.device != "cpu":
        pytest.skip("work modelled by sleeps: the CPU path")
    _, trusted = _timed_as(referee, server, sh, 0.050, work_ms / 1e3)
    cheat, _ = _timed_as(referee, server, sh, 0.0, work_ms / 1e3, stall_small_s=0.08, calibration=trusted,
                         estimate_s=0.0315)
    k = cheat["calls_per_batch"]
    assert cheat["batch_sizes"] == [k // 2, k] and k in (8, 9)
    assert cheat["small_batch_ms"] > cheat["large_batch_ms"]  # the attack ran
    assert cheat["median_ms"] >= work_ms  # (about 3.9 ms: (45 - 10) / 9)


def test_a_candidates_fixed_cost_is_capped_at_the_larger_of_the_trusted_servers_intercepts():
    """Eager and torch.compile both run on trusted servers; compile's runs Triton kernels, as most candidates do,
    and its fixed cost per batch may be the larger. The calibration takes the larger, at each shape both timed."""
    from types import SimpleNamespace

    from sandbox.harness.referee import Referee

    referee = Referee.__new__(Referee)
    fixed = {("main", "eager"): 0.9, ("main", "compile"): 1.4, ("odd", "eager"): 0.8}
    referee.spec = {"implementations": [{"name": "eager", "file": "e", "cls": "Model"},
                                        {"name": "compile", "file": "c", "cls": "Model", "compile": True}]}
    loaded = []
    referee.link = SimpleNamespace(ask=lambda message, stage: loaded.append(message["file"]) or {"ok": True})
    referee.stages = SimpleNamespace(done=lambda name: None)

    def timed(sh, check):
        impl = "compile" if loaded[-1] == "c" else "eager"
        return {"median_ms": 1.0}, {"tiny_ms": 0.1, "read_ms": 0.0, "stage_ms": 0.0, "calls_per_batch": 4,
                                    "fixed_ms": fixed[(sh["shape"]["name"], impl)]}

    referee._timed = timed
    out = referee._baselines([{"shape": {"name": "main"}}, {"shape": {"name": "odd"}}])
    assert out["calibration"]["main"]["fixed_ms"] == 1.4  # compile's, the larger
    assert out["calibration"]["odd"]["fixed_ms"] == 0.8  # compile is timed at the main shape only


def test_energy_is_read_around_the_timed_batches_and_topped_up_only_while_their_windows_are_short(session,
                                                                                                 monkeypatch):
    """NVML's counter (here a fake one: 1000 W) is read outside every timed batch's window at the main shape; batches
    more are run (and checked like the timed ones) only while the windows add up to less than ENERGY_WINDOW_S."""
    import time

    from sandbox.harness import referee as referee_module

    referee, server, sh = session
    reads = []

    def millijoules() -> int:
        reads.append(time.monotonic())
        return int(time.monotonic() * 1e6)  # 1e6 mJ a second: 1000 W

    referee._millijoules = millijoules
    trusted = {"tiny_ms": 1e-4, "read_ms": 0.0, "stage_ms": 0.0, "calls_per_batch": 1}
    for window_s in (0.0, 0.5):  # windows always long enough; then never (a cap of batches more)
        monkeypatch.setattr(referee_module, "ENERGY_WINDOW_S", window_s)
        monkeypatch.setattr(referee_module, "ENERGY_MAX_BATCHES", 3)
        reads.clear()
        summary, _ = referee._timed(sh, check=False, calibration=trusted)
        extra = summary["energy_extra_batches"]
        assert extra == (0 if window_s == 0.0 else 3), summary
        assert summary["energy_calls"] == summary["reps"] + extra * summary["calls_per_batch"], summary
        assert len(reads) == 1 + 2 * (summary["batches"] + extra)  # (one read says a meter is there)
        assert summary["avg_power_w"] >= 999 and summary["energy_j_per_call"] > 0, summary


def test_a_server_that_stalls_a_third_of_its_larger_batches_cannot_hide_a_regression_from_recheck(session,
                                                                                                  monkeypatch):
    """An attacker's review (helper-15, eighth session): stalling every third batch of K calls leaves the reported
    median near the kernel's but puts the IQR's upper quartile among the stalled batches, and recheck took the
    candidate's IQR as its noise (up to the whole approved median): a 5 -> 8 ms regression passed as noise. The
    noise is now the trusted server's spread, timed beside it."""
    import time

    import sandbox.harness.referee as referee_module
    from appliance.db import Timing
    from appliance.recheck import compare_timings

    monkeypatch.setitem(referee_module.BATCH_TARGET_MS, "cpu", 280.0)
    monkeypatch.setitem(referee_module.MIN_BATCHES, "cpu", 21)
    referee, server, sh = session
    if referee.device != "cpu":
        pytest.skip("work modelled by sleeps: the CPU path")
    trusted_server, trusted = _timed_as(referee, server, sh, 0.050, 0.005)
    approved, _ = _timed_as(referee, server, sh, 0.025, 0.005, calibration=trusted, estimate_s=0.0315)
    handle, large = server.handle, []

    def stalling(op, message, fds):
        if op == "call" and message.get("count", 1) == len(server.slots[message["slots"]].args) > 1:
            large.append(1)
            if len(large) % 3 == 0:
                time.sleep(0.25)
        return handle(op, message, fds)

    server.handle = stalling
    try:
        regressed, _ = _timed_as(referee, server, sh, 0.025, 0.008, calibration=trusted, estimate_s=0.0315)
    finally:
        server.handle = handle
    assert regressed["iqr_ms"] > approved["median_ms"]  # the attack ran: its own IQR would have hidden a doubling

    def rows(candidate: dict) -> list:
        return [Timing(evaluation_id=0, shape="main", implementation=impl, device="cpu", median_ms=t["median_ms"],
                       iqr_ms=t["iqr_ms"]) for impl, t in (("candidate", candidate), ("eager", trusted_server))]

    flagged, why = compare_timings(rows(approved), rows(regressed))
    assert flagged and "slower beyond the noise" in why, why
