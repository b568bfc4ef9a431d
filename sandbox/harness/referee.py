"""The referee: the trusted side of an evaluation. It owns the inputs, the output buffers and the clock.

    python -m sandbox.harness.referee SPEC       the kernel server's socket is fd $APPLIANCE_SERVER_FD

It runs the task's own code (jailed, like the candidate) and talks to one kernel server (sandbox/harness/server.py)
over an AF_UNIX socket, with buffers shared between the two (sandbox/harness/shared.py). Roles:

  baselines   the server runs the task's Model, eager and torch.compile'd: their times, the shapes' outputs, the
              reference's ops, and the calibration (a request's fixed cost, our read of the outputs) candidates
              are timed with;
  candidate   the server runs ModelNew: correctness on every shape and seed, then timing, with checks;
  profile     one call inside cudaProfilerStart/Stop, for Nsight Compute wrapped around the server.

What a candidate's process says is never believed. For each call the referee draws fresh inputs from the task's
get_inputs() under a secret seed into memory of its own, which the server cannot map. Only once its clock runs does
it copy them into the shared buffers (the out buffers are poisoned beforehand), flush the L2 (GPU) and send
"call": inputs the server can see before the clock starts would let it do the work ahead of the window. The copy is
timed on our own stream and taken off, never more than beside the trusted server. On a GPU the server's calls
allocate from an arena the referee owns (sandbox/harness/arena.py), so outputs are born where the referee reads them
and nothing is copied; the server says where each one is, and the referee checks every place (inside the arena,
aligned, no two calls' outputs sharing a byte). On the CPU outputs are copied into the out buffers inside the call.

A batch of K calls is timed by the referee's clock from before that copy until it has read every byte of the
outputs itself. Taken off: our copy of the inputs, the calibrated fixed cost of a request (a tiny kernel's round trip,
measured after the same device work of ours as a batch: on a GPU shared by two processes the switch between their
contexts costs more than the round trip), and our own read of the outputs; each never more than beside the trusted
server.
Afterwards it picks in secret which timed calls to check (enough that skipping 5% of calls is caught with
probability >= 0.999), copies their outputs at once, draws their inputs again from their seeds, and checks inputs
and outputs against the float64 reference: the first of a shape whole, the others at elements drawn in secret and
in a few passes over the whole. Outputs must be final when the server answers: their checksums are taken again at
once and after the checks.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import select
import socket
import statistics
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

from sandbox import protocol
from sandbox.harness import compare
from sandbox.harness.compare import compare_in_norm, compare_outputs, judged_at_a_sample, secret_sample
from sandbox.harness.common import Stages, as_outputs, device_turn, environment, write_result
from sandbox.harness.task_code import (TaskFault, build_model, device_out_of_memory, dtype_of, init_inputs, load_task,
                                       make_inputs, set_sizes, task_call)
from sandbox.protocol import ProtocolError, Stage, Verdict

ENV_FD = "APPLIANCE_SERVER_FD"
SKIP_FRACTION, MISS_PROBABILITY = 0.05, 0.001  # skipping 5% of timed calls is caught with probability >= 0.999
BATCH_TARGET_MS = {"cuda": 5.0, "cpu": 2.0}  # a batch at least this long: what is left of a call's fixed cost
# after the calibration is taken off (a first launch, a wake-up) is shared by its calls
MIN_BATCHES = {"cuda": 15, "cpu": 5}
MAX_BATCHES = {"cuda": 100, "cpu": 50}
MAX_CALLS_PER_BATCH = 256
TIMING_POOL_BYTES = {"cuda": 8 << 30, "cpu": 1 << 30}  # a timed batch's inputs and out buffers (one set may be
# more); the referee holds a private copy of the same size, where the inputs are drawn before the window
ARENA_SLACK_BYTES = 256 << 20  # of the arena, beyond twice the outputs of the largest batch: the calls' workspace
CALIBRATION_ROUNDS = 21
# No trusted calibration: nothing taken off.
UNCALIBRATED = {"tiny_ms": 0.0, "read_ms": 0.0, "stage_ms": 0.0, "calls_per_batch": 1, "fixed_ms": 0.0}
# A batch's fixed cost taken off a candidate's windows: its own (the intercept), but never more than the trusted
# server's plus this fraction of the work in the candidate's smaller batch as its larger batches give it (which no
# stall can raise). A server that stalls its small batches to flatten the line gains at most this much; an honest
# one whose intercept is noisy-high loses no more.
FIXED_SLACK = 0.02
SPIN_S = 0.05  # the referee polls this long for an answer before it blocks (GPU; see protocol.receive)
ENERGY_WINDOW_S, ENERGY_MAX_BATCHES = 0.1, 30  # energy: calls over at least this long, or this many batches
SETTLE_S = 0.02  # between an answer and the second look at its outputs
# A sampled timed call is judged at this many secretly drawn elements of each output (all of one up to 8x that;
# compare.judged_at_a_sample), the first sampled call of each shape whole: judging a whole 1 GiB output took tens
# of float64 passes over it, and the ~140 sampled calls of a full-size shape held the device for most of an
# evaluation.
CHECKED_ELEMENTS = 1 << 16
WAIT_LOOK_S, STOPPED_GAP_S = 1.0, 3.0  # waiting for an answer: a look a second; a longer gap is time stopped


class Gone(Exception):
    """The kernel server closed the connection or stopped answering: the controller reads its jail's record."""

    def __init__(self, stage: Stage, reason: str):
        super().__init__(reason)
        self.stage, self.reason = stage, reason


class Rejected(Exception):
    def __init__(self, verdict: Verdict, stage: Stage, reason: str, untrusted: dict | None = None):
        super().__init__(reason)
        self.verdict, self.stage, self.reason, self.untrusted = verdict, stage, reason, untrusted or {}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    from sandbox.harness.common import prepare_device, settle_cpu_math

    prepare_device(spec["device"])
    import torch

    settle_cpu_math()
    if not spec.get("fused_compare", True):
        compare.FUSED_DEVICES.clear()

    # The eager reference the precision-tied bound is measured against runs in the task's dtype for real: cuDNN's
    # default TF32 for fp32 convolutions would make its error, and so the bound, a thousand times larger.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    sock = socket.socket(fileno=int(os.environ.pop(ENV_FD)))
    sock.settimeout(spec.get("call_timeout_s", 600.0))
    try:
        result = Referee(spec, Link(sock, SPIN_S if spec["device"].startswith("cuda") else 0.0)).run()
    except BaseException as exc:  # noqa: BLE001 - sorted below; anything else is our bug and propagates
        if (oom := device_out_of_memory(exc)) is not None:
            # Beside other evaluations the device may simply have been full: the controller runs it again alone.
            result = {"status": "out_of_memory", "reason": str(exc)[:2000], "message": oom}
        elif isinstance(exc, TaskFault):
            result = {"status": "task_error", "reason": str(exc), **exc.info}
        else:
            raise
    finally:
        try:
            protocol.send(sock, {"op": "exit"})
        except OSError:
            pass
    write_result(spec["result"], result)
    return 0


class Link:
    """The referee's end of the socket: every answer parsed by the protocol's bounded reader."""

    def __init__(self, sock: socket.socket, spin_s: float = 0.0):
        self.sock, self.spin_s = sock, spin_s

    def _wait_for_answer(self) -> None:
        """Poll for `spin_s` (an answer within it wakes no one), then wait for the answer for the socket's timeout
        of *running* time: a gap between two looks much longer than a look is time this process was stopped while
        another evaluation measured (sandbox/gate.py), which is no one's slowness here."""
        if protocol.spin(self.sock, self.spin_s):
            return
        budget, waited, last = self.sock.gettimeout(), 0.0, time.monotonic()
        while not select.select([self.sock], [], [], WAIT_LOOK_S)[0]:
            now = time.monotonic()
            if now - last < STOPPED_GAP_S:
                waited += now - last
            last = now
            if budget is not None and waited > budget:
                raise TimeoutError

    def ask(self, message: dict, stage: Stage, fds: tuple[int, ...] = ()) -> dict:
        try:
            protocol.send(self.sock, message, fds)
            self._wait_for_answer()
            answer, extra = protocol.receive(self.sock)
        except TimeoutError:
            raise Gone(stage, "the kernel server did not answer in time") from None
        except ProtocolError as exc:
            raise Rejected(Verdict.PROTOCOL_ERROR, stage, f"the kernel server's answer broke the protocol: {exc}")
        except (EOFError, OSError) as exc:
            raise Gone(stage, f"the kernel server went away ({type(exc).__name__})") from None
        for fd in extra:
            os.close(fd)
        try:
            answer = protocol.answer_of(answer)
        except Exception as exc:  # noqa: BLE001 - whatever an answer makes our reader raise is the answer's fault
            raise Rejected(Verdict.PROTOCOL_ERROR, stage, f"the kernel server's answer broke the protocol: "
                           f"{type(exc).__name__}: {str(exc)[:200]}") from None
        if not answer["ok"]:
            f = answer["failure"]
            raise Rejected(f["verdict"], f["stage"], f["reason"], {k: f[k] for k in ("type", "traceback", "line")})
        return answer


class Slots:
    """`count` calls' inputs and out buffers in one shared pool: slot i's input tensors and out buffers (poisoned
    before every call; the server copies outputs there when they are not in the arena). Registered with the server
    once, so that a "call" names only the set.

    Inputs are drawn into a private copy of the pool's input span (`fill`), which the server never maps, and made
    visible in one copy (`stage`) only once the referee's clock runs: the server cannot compute on them ahead of
    the window."""

    def __init__(self, link: Link, device: str, name: str, sh: dict, count: int):
        import torch

        from sandbox.harness.shared import Pool, layout

        inputs, outputs, layout_kind = sh["example"], sh["outputs"], sh["shape"]["layout"]
        self.name, self.count, self.inputs, self.shape, self.outputs = name, count, inputs, sh["shape"], outputs
        in_specs = [(str(a.dtype).removeprefix("torch."), tuple(a.shape), _strides(a.shape, layout_kind))
                    for a in inputs if isinstance(a, torch.Tensor)]
        out_specs = [(o["dtype"], tuple(o["shape"]), None) for o in outputs]
        # Every call's inputs first, then every call's out buffers: the inputs are one span, copied in one go.
        entries, nbytes = layout(in_specs * count + out_specs * count)
        n_in, n_out = len(in_specs), len(out_specs)
        ins = [entries[i * n_in:(i + 1) * n_in] for i in range(count)]
        outs = [entries[count * n_in + i * n_out:count * n_in + (i + 1) * n_out] for i in range(count)]
        self.entries = list(zip(ins, outs))
        # Where the first i+1 calls' inputs end: a batch of the first k calls stages only theirs.
        self._input_ends = [max((e["offset"] + e["nbytes"] for e in entries[:(i + 1) * n_in]), default=0)
                            for i in range(count)]
        inputs_end = self._input_ends[-1]
        self.pool = Pool.create(device, max(nbytes, 1))
        self.private = Pool.create(device, max(inputs_end, 1))  # never exported: the server cannot map it
        span = {"dtype": "uint8", "shape": [inputs_end], "strides": None, "offset": 0}
        self._shared_inputs, self._private_inputs = self.pool.tensor(span), self.private.tensor(span)
        self.views = [([self.pool.tensor(e) for e in i], [self.pool.tensor(e) for e in o]) for i, o in self.entries]
        self._drawn = [[self.private.tensor(e) for e in i] for i, _ in self.entries]
        fd = self.pool.export_fd()
        try:
            link.ask({"op": "pool", "name": name, "nbytes": self.pool.nbytes}, Stage.LOAD, (fd,))
        finally:
            os.close(fd)
        link.ask({"op": "slots", "name": name, "calls": [self._call(i) for i in range(count)], "outputs": outputs},
                 Stage.LOAD)

    def _call(self, i: int) -> dict:
        """Slot i's inputs (non-tensor arguments as values) and out buffers, as the server is told them."""
        import torch

        ins, outs = self.entries[i]
        args, k = [], 0
        for a in self.inputs:
            if isinstance(a, torch.Tensor):
                args.append({"buffer": {"pool": self.name, "entry": ins[k]}})
                k += 1
            else:
                args.append({"value": a})
        return {"args": args, "outs": [{"pool": self.name, "entry": e} for e in outs]}

    def fill(self, i: int, args: list) -> None:
        """Slot i's next inputs, in the private copy (the server sees them at `stage`), and its out buffers
        poisoned: a call that writes nothing leaves NaN / -1 (nothing secret: poisoned in place)."""
        import torch

        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for view, a in zip(self._drawn[i], tensors):
            view.copy_(a)
        for out in self.views[i][1]:
            out.reshape(-1).view(torch.uint8).fill_(0xFF)

    def stage(self, count: int | None = None) -> None:
        """The first `count` slots' drawn inputs (default: every slot's) into the shared pool, in one copy
        (asynchronous on a GPU)."""
        end = self._input_ends[(count or self.count) - 1]
        self._shared_inputs[:end].copy_(self._private_inputs[:end])

    def outs(self, i: int) -> list:
        return self.views[i][1]

    def mutated(self, i: int, args: list) -> list[int]:
        import torch

        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        # Bytes, not values: NaN inputs (the nonfinite distribution) are never equal to themselves.
        return [k for k, (view, a) in enumerate(zip(self.views[i][0], tensors)) if not _same(view, a)]

    def close(self) -> None:
        self.views = self._drawn = []
        self._shared_inputs = self._private_inputs = None
        self.pool.close()
        self.private.close()


class Arena:
    """Device memory the referee owns and the server allocates its calls' outputs in (sandbox/harness/arena.py),
    so that they need no copy. The server says where each output is; `outputs` checks every place: inside, aligned,
    the expected size, no two calls' outputs sharing a byte."""

    MAX_VIEWS = 4096

    def __init__(self, pool):
        self.pool = pool
        self._views: dict[tuple, object] = {}

    @classmethod
    def shared_with(cls, link: Link, device: str, nbytes: int) -> Arena:
        """A new arena, poisoned (0xFF), mapped by the server and made its calls' allocator."""
        from sandbox.harness.shared import Pool

        arena = cls(Pool.create(device, nbytes))
        arena.pool.tensor({"dtype": "uint8", "shape": [arena.pool.nbytes], "strides": None, "offset": 0}).fill_(0xFF)
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()  # before the server's context writes a byte: no order holds across contexts
        fd = arena.pool.export_fd()
        try:
            link.ask({"op": "pool", "name": "arena", "nbytes": arena.pool.nbytes}, Stage.LOAD, (fd,))
        finally:
            os.close(fd)
        link.ask({"op": "arena", "pool": "arena"}, Stage.LOAD)
        return arena

    def view(self, offset: int, output: dict):
        key = (offset, output["dtype"], tuple(output["shape"]))
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= self.MAX_VIEWS:
                self._views.clear()
            view = self._views[key] = self.pool.tensor({"dtype": output["dtype"], "shape": output["shape"],
                                                        "strides": None, "offset": offset})
        return view

    def close(self) -> None:
        self._views = {}
        self.pool.close()


def _outputs(slots: Slots, arena: Arena | None, answer: dict, stage: Stage, count: int | None = None) -> list[list]:
    """The tensors the referee reads as each of the first `count` calls' outputs (default: every slot's), from
    where the server says it put them, every place checked here: an out buffer of the call's own, or a span of the
    arena that no other call's output shares."""
    placed = answer.get("outputs")
    n = len(slots.outputs)
    if not (isinstance(placed, list) and len(placed) == (count or slots.count) and
            all(isinstance(row, list) and len(row) == n for row in placed)):
        raise Rejected(Verdict.PROTOCOL_ERROR, stage, "the kernel server's answer does not place every output of "
                       "every call")
    views, spans = [], []
    for j, row in enumerate(placed):
        got = []
        for i, where in enumerate(row):
            if isinstance(where, dict) and len(where) == 1 and where.get("slot") is True:  # (1 == True in Python)
                got.append(slots.outs(j)[i])
                continue
            offset = where.get("offset") if isinstance(where, dict) and len(where) == 1 else None
            if arena is None or type(offset) is not int:
                raise Rejected(Verdict.PROTOCOL_ERROR, stage, f"the kernel server placed an output at {str(where)[:80]}")
            try:
                view = arena.view(offset, slots.outputs[i])
            except ValueError as exc:
                raise Rejected(Verdict.PROTOCOL_ERROR, stage, f"the kernel server placed an output outside the "
                               f"arena: {exc}") from None
            spans.append((offset, offset + view.numel() * view.element_size(), j))
            got.append(view)
        views.append(got)
    spans.sort()
    reach, owner = -1, -1
    for start, end, j in spans:
        if start < reach and j != owner:
            raise Rejected(Verdict.WRONG_OUTPUT, stage, "the outputs of two calls share memory: every call's output "
                           "must be a tensor of its own")
        if end > reach:
            reach, owner = end, j
    return views


def _count(value) -> int | None:
    """A count the server reports (a record, never a check): an int in [0, 2**53), else None. A huge one would
    overflow our float arithmetic and crash the trusted side."""
    return value if type(value) is int and 0 <= value < 2 ** 53 else None


def _median_windows(nets: list[tuple[int, float]]) -> dict[int, float]:
    """Each batch size's median net window, from (calls, net window ms) per batch."""
    return {size: statistics.median(n for k, n in nets if k == size) for size in {k for k, _ in nets}}


def _fixed_cost(windows: dict[int, float]) -> float:
    """The fixed ms of one batch, from two batch sizes' median windows: the intercept of the line through them.
    Whatever a batch costs per call is in the slope; what it costs once is not."""
    (k1, w1), (k2, w2) = sorted(windows.items())
    return (k2 * w1 - k1 * w2) / (k2 - k1)


def _calls_that_fit(device: str, set_bytes: int) -> int:
    """How many calls' inputs and out buffers a timed batch's pool may hold (at least one)."""
    return max(1, TIMING_POOL_BYTES["cuda" if device.startswith("cuda") else "cpu"] // max(set_bytes, 1))


def arena_bytes(records: list[dict]) -> int:
    """Room for the largest timed batch's outputs twice over (the caching allocator rounds up and keeps freed
    blocks) and some workspace, from the shapes' records; a forward that needs more runs beside the arena and has
    its outputs copied. GPU only."""
    need = 0
    for r in records:
        need = max(need, 2 * _calls_per_batch_at_most("cuda", r) * r["output_bytes"])
    return need + ARENA_SLACK_BYTES


def _calls_per_batch_at_most(device: str, record: dict) -> int:
    return min(MAX_CALLS_PER_BATCH, _calls_that_fit(device, record["input_bytes"] + record["output_bytes"]))


def pool_bytes(device: str, records: list[dict]) -> int:
    """The largest timed batch's pool (its inputs and out buffers), from the shapes' records."""
    return max(((r["input_bytes"] + r["output_bytes"]) * _calls_per_batch_at_most(device, r) for r in records),
               default=0)


def private_bytes(device: str, records: list[dict]) -> int:
    """The largest timed batch's inputs, as the referee draws them in memory of its own before the window."""
    return max((r["input_bytes"] * _calls_per_batch_at_most(device, r) for r in records), default=0)


def _strides(shape, layout_kind: str) -> tuple[int, ...] | None:
    """Contiguous, or rows in a wider buffer, so that a kernel taking a row's start as row x width (ignoring the
    outer strides) reads the wrong rows:
    - "strided": a stride-2 view whose rows are further apart than 2 x their width;
    - "padded": inner stride 1, rows 16 elements further apart than their width (a slice of a wider buffer)."""
    if layout_kind not in ("strided", "padded") or not shape:
        return None
    if layout_kind == "padded" and len(shape) < 2:
        return None  # one row: nothing to pad between
    inner = 2 if layout_kind == "strided" else 1
    wide = (*shape[:-1], 2 * shape[-1] + 2 if inner == 2 else shape[-1] + 16)
    strides, step = [], 1
    for n in reversed(wide):
        strides.insert(0, step)
        step *= max(n, 1)
    return (*strides[:-1], inner)


def _checksums(outs: list[list]) -> list[int]:
    """A sum of every output of every call, read as the widest integer words their size allows (a byte-wise
    sum of a gigabyte took 5 ms on the H200), in one go (one synchronisation)."""
    import torch

    def words(b):
        flat = b.reshape(-1).view(torch.uint8)
        for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
            if flat.numel() % size == 0:
                return flat.view(dtype)
        return flat

    sums = [words(b).sum(dtype=torch.int64) for row in outs for b in row]
    return torch.stack(sums).tolist() if sums else []


class Referee:
    def __init__(self, spec: dict, link: Link):
        import torch

        self.spec, self.link = spec, link
        self.device, self.dtype = spec["device"], dtype_of(spec)
        self.cuda = self.device == "cuda"
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.secret = random.SystemRandom()
        self.clock = time.perf_counter
        self.stages = Stages()
        self._flush_buffer = None
        self._meter = None  # NVML's energy counter, made on first use (GPU only)
        self._launches = math.inf  # the fewest own launches per call the server reported in a timed batch
        self._in_arena: list[float] = []  # per timed batch, the share of outputs the server made in the arena
        self._raw: list[float] = []  # per timed batch, its window per call before the calibration is taken off
        self._staged: list[float] = []  # per timed batch, our copy of its inputs per call (ms, before any cap)
        self.arena: Arena | None = None  # GPU: where the server's calls put their outputs
        self.task = None
        self.provenance: dict = {}
        self.cases: list[dict] = []
        self._models_key, self._models = None, None  # the last reference Models, by (shape, seed) (_compare)
        self._whole_check_due = True  # the next sampled timed call is judged whole (_check_timed)
        self.checked_elements = spec.get("checked_elements", CHECKED_ELEMENTS)  # the later ones at this many
        self._spent: defaultdict[str, float] = defaultdict(float)  # a shape's timing stage, seconds per phase

    @contextlib.contextmanager
    def _spending(self, phase: str):
        """Where a shape's timing stage goes (evidence: `referee_s` in its summary). Host seconds: device work
        not yet synchronised falls on the phase that waits for it. A dotted phase ("batch.windows") is a part of
        every phase it happens in (the estimate's, the timed and the energy's batches; the checks)."""
        t0 = self.clock()
        try:
            yield
        finally:
            self._spent[phase] += self.clock() - t0

    # --- the whole run ---------------------------------------------------------------------------------------

    def run(self) -> dict:
        spec = self.spec
        ceilings = self._ceilings() if spec.get("ceilings") and self.cuda else None
        self.task = load_task(spec)
        self.stages.done("load")
        shapes, dropped = [], []
        with device_turn(shared=True):  # the reference runs on the device: never beside someone's measurement
            if self.cuda:  # the fused comparison's kernel compiled now, not in the first check (compare_kernel)
                floating = {d for d in (spec["dtype"], "float32") if d in compare.UNIT_ROUNDOFF}
                compare.warm_fused(floating, set(spec["tolerances"]))
            for s in spec["shapes"]:
                try:
                    shapes.append(self._shape(s))
                except TaskFault as fault:
                    # Only a derived shape is dropped (its sizes are the rules' in the baselines' run, drawn anew
                    # for each candidate's: a size the Model requires may hold at one draw and not another), and
                    # never for running out of memory beside other evaluations.
                    if (not s.get("origin", "").startswith("derived") or spec["role"] not in ("baselines", "candidate")
                            or device_out_of_memory(fault) is not None):
                        raise
                    # A derived shape the task's own Model cannot run (a size it requires, an input it rejects).
                    dropped.append({"name": s["name"], "sizes": s["sizes"], "origin": s["origin"],
                                    "reason": str(fault)[:500]})
        out = {"shapes": [s["record"] for s in shapes], "dropped_shapes": dropped,
               "environment": environment(self.device)}
        if ceilings is not None:
            out["ceilings"] = ceilings
        role = spec["role"]
        try:
            if self.cuda:
                with device_turn(shared=True):
                    self.arena = Arena.shared_with(self.link, self.device,
                                                   arena_bytes([s["record"] for s in shapes]))
            if role == "baselines":
                out |= self._baselines(shapes)
            elif role == "profile":
                self._profile(shapes[0])
            else:
                out |= self._candidate(shapes)
        except Rejected as r:
            return out | {"status": "rejected", "verdict": r.verdict, "stage": r.stage, "reason": r.reason,
                          "untrusted": r.untrusted, "cases": self.cases, "stage_s": self.stages.summary()}
        except Gone as g:
            return out | {"status": "server_gone", "stage": g.stage, "reason": g.reason, "cases": self.cases,
                          "stage_s": self.stages.summary()}
        return out | {"status": "ok", "stage_s": self.stages.summary()}

    def _shape(self, shape: dict) -> dict:
        """What the task's Model does at one shape: its inputs (an example set), outputs and ATen ops."""
        import torch

        from sandbox.harness.provenance import record_ops

        task, spec, seed = self.task, self.spec, spec_seed(self.spec)
        set_sizes(task, shape)
        init = init_inputs(spec, task, seed)
        example = make_inputs(spec, task, shape, seed)
        for a in example:
            if not isinstance(a, (torch.Tensor, int, float, bool, str, type(None))):
                raise TaskFault("get_inputs()", TypeError(f"an input of type {type(a).__name__} cannot be sent to "
                                                          "the kernel server (tensors, numbers, strings only)"),
                                spec["task_display"])
        model = build_model(spec, task, init, seed, self.device, self.dtype)
        with torch.no_grad():
            result, ops = task_call(f"Model.forward at shape {shape['name']}", spec, record_ops, model, *example)
            if shape.get("origin", "").startswith("derived") and spec["role"] in ("baselines", "candidate"):
                # Every check at this shape needs the float64 reference too: a derived shape where it cannot run
                # (an op without a float64 kernel, a check in the Model) is dropped here, not failed later.
                from sandbox.harness.common import cast_floating

                task_call(f"the float64 reference at shape {shape['name']}", spec,
                          build_model(spec, task, init, seed, self.device, self.dtype).to(torch.float64),
                          *cast_floating(example, torch.float64))
        outs = as_outputs(result)
        if outs is None:
            raise TaskFault("Model.forward", TypeError(f"returned {type(result).__name__}, not tensor(s)"),
                            spec["task_display"])
        outputs = [{"dtype": str(o.dtype).removeprefix("torch."), "shape": list(o.shape)} for o in outs]
        tensors = [a for a in example if isinstance(a, torch.Tensor)]
        record = {"name": shape["name"], "sizes": shape["sizes"], "input_shapes": [list(a.shape) for a in tensors],
                  "outputs": outputs, "ops": ops, "input_bytes": sum(a.numel() * a.element_size() for a in tensors),
                  "output_bytes": sum(o.numel() * o.element_size() for o in outs),
                  "origin": shape.get("origin", ""), "timed": shape.get("timed", True),
                  "distribution": shape["distribution"]["kind"], "layout": shape["layout"]}
        del model, result, outs
        # Kept for its shapes, dtypes and non-tensor values only (every call draws its own inputs): on the meta
        # device, so that no shape's example holds device memory for the rest of the run (KernelBench's ReLU draws
        # 6 GiB an input).
        example = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in example]
        return {"shape": shape, "example": example, "outputs": outputs, "record": record}

    # --- roles -----------------------------------------------------------------------------------------------

    def _baselines(self, shapes: list[dict]) -> dict:
        timings, calibration, compile_fixed, loaded = {}, {}, {}, None
        for i, sh in enumerate(s for s in shapes if s["shape"].get("timed", True)):
            name = sh["shape"]["name"]
            timings[name] = {}
            # torch.compile recompiles for every new shape: timed on the main shape only, where speedups are quoted.
            for impl in (m for m in self.spec["implementations"] if i == 0 or not m.get("compile")):
                try:
                    if loaded != impl["name"]:
                        self.link.ask({"op": "load", "file": impl["file"], "cls": impl["cls"],
                                       "compile": impl.get("compile", False)}, Stage.LOAD)
                        loaded = impl["name"]
                    summary, calib = self._timed(sh, check=False)
                    timings[name][impl["name"]] = summary
                    if impl["name"] == "eager":
                        calibration[name] = calib
                    elif impl.get("compile"):
                        compile_fixed[name] = calib["fixed_ms"]
                except (Rejected, Gone) as exc:
                    timings[name][impl["name"]] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                self.stages.done(impl["name"])
        # torch.compile's server runs Triton kernels, as most candidates do: a candidate's fixed cost per batch may
        # be as large as either trusted server's (eager's alone capped Triton candidates' below their own)
        for name, fixed in compile_fixed.items():
            if name in calibration:
                calibration[name]["fixed_ms"] = max(calibration[name]["fixed_ms"], fixed)
        return {"timings": timings, "calibration": calibration}

    def _candidate(self, shapes: list[dict]) -> dict:
        impl = self.spec["implementations"][0]
        self.link.ask({"op": "load", "file": impl["file"], "cls": impl["cls"]}, Stage.LOAD)
        self.stages.done("load_candidate")
        for sh in shapes:
            self._correctness(sh)
        self.stages.done("correctness")
        timings = {}
        for sh in (s for s in shapes if s["shape"].get("timed", True)):  # (derived shapes: correctness only)
            # Without the trusted server's calibration for this shape (its eager baseline failed there, or none was
            # asked for), nothing is taken off: what the candidate's own server costs is not ours to subtract.
            calibration = self.spec["calibration"].get(sh["shape"]["name"]) or UNCALIBRATED
            timings[sh["shape"]["name"]], _ = self._timed(sh, check=True, calibration=calibration)
        self.stages.done("timing")
        return {"timings": timings, "cases": self.cases, "provenance": self.provenance}

    def _profile(self, sh: dict) -> None:
        impl = self.spec["implementations"][0]
        self.link.ask({"op": "load", "file": impl["file"], "cls": impl["cls"]}, Stage.LOAD)
        slots = self._slots(sh, "profile", 1)
        self._build(sh, spec_seed(self.spec))
        for profile in (False, True):  # compiled and warm outside the profiled range
            slots.fill(0, make_inputs(self.spec, self.task, sh["shape"], self.secret.getrandbits(62)))
            slots.stage()
            self.sync()
            self.link.ask({"op": "call", "slots": slots.name, "profile": profile}, Stage.TIMING)
        slots.close()

    # --- correctness -----------------------------------------------------------------------------------------

    def _correctness(self, sh: dict) -> None:
        import torch

        shape, spec = sh["shape"], self.spec
        slots = self._slots(sh, "check", 1)
        for seed in spec["seeds"]:
            where = f"at shape {shape['name']} ({_sizes_text(shape['sizes'])}), seed {seed}"
            # The inputs under a secret seed (the model's weights under the public one): a candidate that knows the
            # seeds could recognise the checked inputs (a fingerprint of a few values) and be right only on them.
            input_seed = self.secret.getrandbits(61) << 1 | seed & 1  # (parity kept: it picks a shift's sign)
            with device_turn(shared=True):  # all our device work is in turns: none of it beside a measurement
                init = self._build(sh, seed)
                args = make_inputs(spec, self.task, shape, input_seed)
                slots.fill(0, args)
                slots.stage()  # (untimed: nothing to gain from seeing them early)
                self.sync()
                answer = self.link.ask({"op": "call", "slots": slots.name, "record": True}, Stage.CORRECTNESS)
                outs = _outputs(slots, self.arena, answer, Stage.CORRECTNESS)[0]
                snapshot = [o.clone() for o in outs]
                self.sync()
                self._note_provenance(answer, shape.get("timed", True))
                time.sleep(SETTLE_S)
                if any(not _same(a, b) for a, b in zip(outs, snapshot)):
                    raise Rejected(Verdict.DEFERRED_WORK, Stage.CORRECTNESS,
                                   f"the output changed after forward returned {where}: work left running on "
                                   "another stream or thread is not part of the call (and not timed)")
                if changed := slots.mutated(0, args):
                    raise Rejected(Verdict.INPUT_MUTATED, Stage.CORRECTNESS,
                                   f"forward modified input(s) {changed} in place {where}")
                margin = self._compare(sh, init, seed, args, snapshot, where, Verdict.WRONG_OUTPUT)
            self.cases.append({"shape": shape["name"], "seed": seed, "input_seed": input_seed, "kind": "pass",
                               "reason": "", "margin": round(margin, 4)})
            del args, snapshot, outs
        slots.close()
        self._models_key, self._models = None, None
        if self.cuda:
            torch.cuda.empty_cache()

    def _note_provenance(self, answer: dict, timed: bool = True) -> None:
        """What the server says its calls ran: a policy check on honest output (it can lie), never a security one.
        Recorded on every call; the fallback rule reads the calls at timed shapes (where speed is claimed). At a
        correctness-only shape (a bare file's derived ones) running the reference's own ops is no fallback: a
        kernel made for the task's sizes, correct at every other (torch.compile's written out, say), may do so."""
        ops, launches = answer.get("ops"), _count(answer.get("launches"))
        if not (isinstance(ops, list) and all(isinstance(o, str) for o in ops) and launches is not None):
            raise Rejected(Verdict.PROTOCOL_ERROR, Stage.CORRECTNESS, "the kernel server sent no record of what "
                           "forward ran")
        p = self.provenance
        ops = {o[:80] for o in ops[:500]}
        if not timed:
            p["untimed_ops"] = sorted(set(p.get("untimed_ops", [])) | ops)
            p["untimed_own_launches"] = min(p.get("untimed_own_launches", launches), launches)
            p["untimed_calls"] = p.get("untimed_calls", 0) + 1
            return
        p["ops"] = sorted(set(p.get("ops", [])) | ops)
        p["own_launches"] = launches if "own_launches" not in p else min(p["own_launches"], launches)
        p["calls"] = p.get("calls", 0) + 1

    def _compare(self, sh: dict, init: list, seed: int, args: list, outs: list, where: str, verdict: Verdict,
                 elements: int | None = None) -> float:
        """`outs` against the float64 reference for `args`, within a bound tied to the precision the task's own
        Model reaches in its dtype on the same inputs (compare.py), unless the manifest sets one; a failure is
        `verdict`-kind (timed calls) or its own. With `elements`, judged at that many secretly drawn elements of
        each output (compare.secret_sample). Returns the largest error as a fraction of its bound."""
        import torch

        from sandbox.harness.common import cast_floating

        key = (sh["shape"]["name"], seed)
        eager_model, model = self._models if self._models_key == key else (None, None)
        self._models_key, self._models = None, None  # (the last pair freed before the next is built)
        if eager_model is None:
            eager_model = build_model(self.spec, self.task, init, seed, self.device, self.dtype)
        with torch.no_grad(), self._spending("checks.forwards"):
            eager = as_outputs(task_call("the task's Model", self.spec, eager_model, *args))
            if model is None:  # made after eager's first forward: weights a lazy module makes then are eager's too
                model = self._float64_copy(eager_model)
            refs = as_outputs(task_call("float64 reference", self.spec, model, *cast_floating(args, torch.float64)))
        if model is not eager_model:  # kept for the shape's next checked call (building one can take seconds)
            self._models_key, self._models = key, (eager_model, model)
        margins: list[float] = []
        # Inputs with inf and NaN: only what the reference defines (a finite result) is judged.
        defined_only = sh["shape"]["distribution"]["kind"] == "nonfinite"
        whole = None
        if elements is not None and any(judged_at_a_sample(o.numel(), elements) for o in outs):  # (others: whole)
            # The per-element bound at a secret sample (the count, shapes and dtypes too), then the whole outputs in
            # a few passes (compare_in_norm).
            where += (f" (judged at {elements} secretly drawn elements, then whole: non-finite values, the largest "
                      "error, L2)")
            whole = (outs, refs, eager)
            outs, refs, eager = secret_sample(outs, refs, eager, elements, self.secret.getrandbits(62))
        with self._spending("checks.compare"):
            failure = compare_outputs(outs, refs, sh["outputs"], self.spec["tolerances"], where, eager=eager,
                                      margins=margins, defined_only=defined_only)
            if whole is not None and not failure:
                failure = compare_in_norm(*whole[:2], self.spec["tolerances"], where, eager=whole[2],
                                          defined_only=defined_only)
        if not failure:
            return max(margins, default=0.0)
        if verdict == Verdict.TIMED_OUTPUT_MISMATCH:
            raise Rejected(verdict, Stage.TIMING, f"{failure['kind']}: {failure['reason']} (the outputs of timed "
                           "calls must be as correct as those of the correctness calls)")
        raise Rejected(Verdict(failure["kind"]), Stage.CORRECTNESS, failure["reason"])

    @staticmethod
    def _float64_copy(model):
        """The task's Model in float64, a copy of `model` (its weights as they are, rounded to the task's dtype);
        where a Model cannot be copied, `model` itself, converted (then nothing is kept for the next check)."""
        import copy

        import torch

        try:
            return copy.deepcopy(model).to(torch.float64)
        except Exception:  # noqa: BLE001 (the task's code: anything it holds may refuse to be copied)
            return model.to(torch.float64)

    def _build(self, sh: dict, seed: int) -> list:
        set_sizes(self.task, sh["shape"])
        init = init_inputs(self.spec, self.task, seed)
        if not all(isinstance(a, (int, float, bool, str, type(None), list, tuple)) for a in init):
            raise TaskFault("get_init_inputs()", TypeError("init inputs must be numbers, strings or lists of them "
                                                           "to reach the kernel server"), self.spec["task_display"])
        self.link.ask({"op": "build", "init": list(init), "seed": seed, "dtype": self.spec["dtype"]}, Stage.LOAD)
        return init

    def _slots(self, sh: dict, name: str, count: int) -> Slots:
        return Slots(self.link, self.device, name, sh, count)

    # --- timing ----------------------------------------------------------------------------------------------

    def _timed(self, sh: dict, check: bool, calibration: dict | None = None) -> tuple[dict, dict]:
        """Time the loaded implementation at one shape (model built under the first seed, which the float64 checks
        rebuild). Returns (summary, calibration: the fixed cost of a request, our copy of one call's inputs and
        our read of its outputs, and the calls per batch, as measured beside this implementation)."""
        seed0 = spec_seed(self.spec)
        self._spent.clear()
        started = self.clock()
        with device_turn(shared=True), self._spending("first_call"):  # the first call compiles (a new shape's kernels)
            init = self._build(sh, seed0)
            single = self._slots(sh, "check", 1)
            self._batch(single, 1, {"tiny_ms": 0.0, "tiny_read_ms": 0.0, "stage_ms": None})  # (only sets K)
        set_bytes = sh["record"]["input_bytes"] + sh["record"]["output_bytes"]
        with device_turn():
            read_cap = calibration["read_ms"] if calibration else None
            with self._spending("calibrate"):
                cal = self._calibrate(single, calibration)
            estimate, cycle = [], []  # ms of one call; ms of one whole single-call batch (inputs drawn, checked)
            for _ in range(3):
                t0 = self.clock()
                estimate.append(self._batch(single, 1, cal, read_cap_ms=read_cap)[0])
                cycle.append((self.clock() - t0) * 1e3)
            self._spent["estimate"] += sum(cycle) / 1e3
            estimate = statistics.median(estimate)
            single.close()
            # K from this server's own estimate, but on a GPU never fewer calls than the trusted server's batches
            # had: a server that dawdles in its estimate calls would otherwise get batches of one, where the fixed
            # cost taken off is largest against its work. Not on the CPU: there a kernel runs in Triton's
            # interpreter, 100-1000x slower than eager, and eager's K made each of its batches take seconds (CPU
            # timings are no speed claims; the fixed cost taken off is capped by the trusted value all the same).
            fewest_trusted = int((calibration or {}).get("calls_per_batch") or 1)
            fewest = fewest_trusted if self.device == "cuda" else 1
            fit = min(MAX_CALLS_PER_BATCH, _calls_that_fit(self.device, set_bytes))
            per_batch = max(1, min(fit, max(fewest, math.ceil(BATCH_TARGET_MS[self.device] / max(estimate, 1e-4)))))
            if self.cuda:  # two batch sizes, so that the fixed cost of a batch is measured, not guessed
                per_batch = max(per_batch, min(fit, 2))
            # The budget bounds the whole batches (drawing inputs, checks), not only the calls in them; the extra
            # shapes get a quarter of it (speedups are quoted on the main shape).
            budget_ms = self.spec["timing_budget_s"] * 1e3 * (1.0 if sh["shape"]["name"] == "main" else 0.25)
            batches = int(min(MAX_BATCHES[self.device], max(MIN_BATCHES[self.device],
                                                            budget_ms / (per_batch * statistics.median(cycle)))))
            # Batches of K/2 and K calls, alternating (so that drift falls on both alike): the fixed cost of a
            # batch (the request, the GPU's switches between our context and the server's, its wake-up) is the
            # intercept of the line through the two sizes' windows (_fixed_cost). One size only where K is 1.
            sizes = [per_batch // 2 if per_batch > 1 and i % 2 == 0 else per_batch for i in range(batches)]
            calls = sum(sizes)
            p = 1 - MISS_PROBABILITY ** (1 / max(1.0, SKIP_FRACTION * calls)) if check else 0.0
            slots = self._slots(sh, "timing", per_batch)
            with self._spending("calibrate"):
                cal = self._calibrate(slots, calibration)  # again, after a copy of these slots' inputs (as a batch)
            if per_batch < fewest_trusted:  # (the CPU, where K is the server's own): a server that dawdles in its
                # estimate calls for batches of one gets no more of the fixed cost off each call than the trusted
                # server's batches gave theirs
                cal["tiny_ms"] *= per_batch / fewest_trusted
            net_cal = cal | {"tiny_ms": 0.0} if per_batch > 1 else cal  # two sizes: the intercept replaces "tiny"
            nets, reads, checked, self._launches, self._in_arena, self._raw = [], [], 0, math.inf, [], []
            self._whole_check_due = True
            self._staged = []
            # Energy at the main shape: NVML's counter read around the timed batches' own windows (outside them),
            # so that no batch more (and no check more) is run for it but where those windows are too short.
            metered = sh["shape"]["name"] == "main" and self._millijoules() is not None
            energy_windows: list | None = [] if metered else None
            for k in sizes:
                with self._spending("batches"):
                    per_call, read, seeds, sums, sample, outs = self._batch(slots, k, net_cal, p, read_cap,
                                                                            energy=energy_windows)
                nets.append((k, per_call * k))
                reads.append(read)
                if check:
                    with self._spending("checks"):
                        checked += self._check_timed(sh, slots, init, seed0, seeds, sums, sample, outs)
                del outs
            line = {}  # the two sizes' median net windows, and the most the fixed cost may be (evidence)
            windows = _median_windows(nets)
            own_fixed = fixed = _fixed_cost(windows) if per_batch > 1 else cal["tiny_ms"]
            if per_batch > 1:
                line = {"small_batch_ms": round(windows[sizes[0]], 4), "large_batch_ms": round(windows[per_batch], 4)}
                # The smaller batch's window as the larger batches give it (k/K of theirs; an honest smaller batch's
                # is at least that). The bounds on the fixed cost below are computed from it, not from the smaller
                # batches' own windows, which a server raises at will by stalling them (an attacker's review: with
                # the larger size reported, stalling every small batch lifted the half-window bound to half the
                # large window, and calls read 20% under their kernel's time).
                small_window = windows[per_batch] * sizes[0] / per_batch
                if calibration is not None:  # a candidate: never more off than beside the trusted server, give or
                    # take FIXED_SLACK (nothing, where the trusted server measured none)
                    trusted_fixed = calibration.get("fixed_ms", 0.0)
                    cap = trusted_fixed + FIXED_SLACK * max(small_window - trusted_fixed, 0.0)
                    fixed, line["fixed_cap_ms"] = min(fixed, cap), round(cap, 4)
                # Never more than half the smaller batch: where noise flattens the line (the CPU, tiny kernels)
                # the intercept can reach a whole window, and a call would read as free.
                fixed = min(max(fixed, 0.0), 0.5 * small_window)
            samples = [max(net - fixed, 0.0) / k for k, net in nets] if per_batch > 1 else [n / k for k, n in nets]
            # The larger size's median per call, (W - fixed) / K for its median window W. Whatever a server does, W
            # holds K calls' work t and its own fixed cost F, and fixed is at most the cap and at most half of k/K
            # of W (k = K/2 or less), so a call reads at least t - (cap - F) / K, and at least 3/4 (t + F/K): at
            # its kernel's time or above wherever F >= K t / 3, which the slower size's median (reported until
            # 2026-12-07) gave only for F >= K t / 2. And an honest server's fixed cost above the cap (Triton
            # servers' 1.3-1.5 ms a batch against eager's 0.9 on an H100) weighs 1/K on each call here, against 2/K
            # at the smaller size (1.28x do_bench on rmsnorm, K = 4).
            reported = [s for s, (k, _) in zip(samples, nets) if k == per_batch]
            median = statistics.median(reported)
            staged = statistics.median(self._staged)
            # (the spread of the reported size's calls: the two sizes mixed differ by the fixed cost left in them,
            # which a server could widen at will by stalling its small batches, and a recheck reads the IQR as noise)
            summary = {"median_ms": median, "iqr_ms": _iqr(reported), "min_ms": min(reported),
                       "reps": calls, "batches": batches, "calls_per_batch": per_batch, "device": self.device,
                       "batch_sizes": sorted(set(sizes)), "fixed_ms": round(fixed, 4),
                       "own_fixed_ms": round(own_fixed, 4), **line,
                       "tiny_ms": round(cal["tiny_ms"], 4), "read_ms": round(statistics.median(reads), 4),
                       "stage_ms": round(staged, 4), "launches_per_call_min": self._launches,
                       "outputs_in_arena": round(statistics.mean(self._in_arena), 4) if self._in_arena else 0.0,
                       "raw_window_ms": round(statistics.median(self._raw), 4)}
            if metered:
                with self._spending("energy_top_up"):
                    energy, more = self._energy(sh, slots, per_batch, cal, p if check else 0.0, read_cap, init, seed0,
                                                energy_windows, calls)
                summary |= energy
                checked += more
            slots.close()
            self._models_key, self._models = None, None
        self._spent["other"] = max(0.0, self.clock() - started - sum(
            v for k, v in self._spent.items() if "." not in k))  # (a dotted phase is part of its parent)
        summary |= {"checked_calls": checked, "check_probability": round(p, 4),
                    "checked_elements_after_the_first": self.checked_elements,
                    "referee_s": {k: round(v, 4) for k, v in sorted(self._spent.items())},
                    "fused_compare": int(self.device in compare.FUSED_DEVICES)}
        return summary, {"tiny_ms": cal["tiny_ms"], "read_ms": statistics.median(reads), "stage_ms": staged,
                         "calls_per_batch": per_batch, "fixed_ms": max(own_fixed, 0.0)}

    def _calibrate(self, slots: Slots, calibration: dict | None) -> dict:
        """The fixed cost of one request, measured as a batch of `slots` is timed (our copy of its inputs and the L2
        flush first, then the server's tiny kernel, then our read), our copy's own time taken off: on a GPU shared
        by two processes, the switch from our context to the server's after our work costs more than the round
        trip itself. Returns its median ms ("tiny_ms"), that of our read of one tiny tensor ("tiny_read_ms", the
        fixed part of any read), and the cap on our copy ("stage_ms" per call, None: as measured). With the
        trusted server's `calibration`, nothing taken off is more than beside it: a slow "tiny" earns nothing,
        nor does a server that slows our copy (its own work time-sliced into it)."""
        import torch

        probe = [[torch.zeros(1, dtype=torch.int64, device=self.device)]]
        windows, reads = [], []
        for _ in range(CALIBRATION_ROUNDS):
            self.sync()
            t0 = self.clock()
            staged = self._stage(slots)
            self._flush()
            self.sync()
            self.link.ask({"op": "tiny"}, Stage.TIMING)
            _checksums(probe)
            t1 = self.clock()
            _checksums(probe)
            windows.append((t1 - t0) * 1e3 - staged)
            reads.append((self.clock() - t1) * 1e3)
        cal = {"tiny_ms": statistics.median(windows), "tiny_read_ms": statistics.median(reads), "stage_ms": None}
        if calibration:
            cal["tiny_ms"] = min(cal["tiny_ms"], calibration["tiny_ms"])
            cal["stage_ms"] = calibration.get("stage_ms", 0.0)
        return cal

    def _batch(self, slots: Slots, k: int, cal: dict, p: float = 0.0, read_cap_ms: float | None = None,
               energy: list | None = None):
        """One timed batch of k calls on fresh inputs, timed as one window: from before our copy of the inputs into
        the shared pool until we have read every byte of the outputs where the server placed them. Taken off: our
        copy (timed on our stream, never more than `cal["stage_ms"]` per call when that is set), the calibrated fixed
        cost of a request (`cal`), and our own read of the outputs beyond its fixed part (never more than the
        trusted server's `read_cap_ms` per call). `energy`, when given, gets the window's (millijoules, seconds),
        read outside it. Returns (ms per call, our read's ms per call, the calls' secret seeds, the outputs'
        checksums, the secret sample: {slot: copies of its outputs taken right after the window}, the outputs)."""
        seeds = [self.secret.getrandbits(62) for _ in range(k)]
        with self._spending("batch.draw_inputs"):
            for j in range(k):  # into our private copy: the server sees none of it before the clock runs
                slots.fill(j, make_inputs(self.spec, self.task, slots.shape, seeds[j]))
            self.sync()
        mj0 = self._millijoules() if energy is not None else None
        t0 = self.clock()
        staged = self._stage(slots, k)
        self._flush()
        self.sync()
        answer = self.link.ask({"op": "call", "slots": slots.name, "count": k}, Stage.TIMING)
        outs = _outputs(slots, self.arena, answer, Stage.TIMING, k)
        sums = _checksums(outs)  # every byte read by us before the clock stops
        t1 = self.clock()
        self._spent["batch.windows"] += t1 - t0
        if energy is not None:
            energy.append((self._millijoules() - mj0, t1 - t0))
        # Picked after the fact, in secret, and copied at once: these copies are what the checks judge.
        sample = {j: [o.clone() for o in outs[j]] for j in range(k) if self.secret.random() < p}
        self.sync()  # the copies done: what is timed next is our read alone
        t2 = self.clock()
        again = _checksums(outs)  # our read alone: what is taken off the window
        read_ms = max(0.0, (self.clock() - t2) * 1e3 - cal["tiny_read_ms"])
        self._spent["batch.after_window"] += self.clock() - t1
        if again != sums:
            raise Rejected(Verdict.DEFERRED_WORK, Stage.TIMING, f"outputs of timed calls at shape "
                           f"{slots.shape['name']} changed after the kernel server answered: work still running "
                           "when it said it was done")
        if read_cap_ms is not None:
            read_ms = min(read_ms, read_cap_ms * k)
        self._staged.append(staged / k)
        if cal.get("stage_ms") is not None:
            staged = min(staged, cal["stage_ms"] * k)
        placed = [w for row in answer["outputs"] for w in row]  # (checked by _outputs)
        self._in_arena.append(sum("offset" in w for w in placed) / max(len(placed), 1))
        launches = _count(answer.get("launches"))  # what the server says it launched: a record, not a check
        self._launches = min(self._launches, launches / k if launches is not None else 0.0)
        self._raw.append((t1 - t0) * 1e3 / k)  # evidence: the window per call before anything is taken off
        window = (t1 - t0) * 1e3 - staged - cal["tiny_ms"] - read_ms
        return max(window, 0.0) / k, read_ms / k, seeds, sums, sample, outs

    def _stage(self, slots: Slots, count: int | None = None) -> float:
        """The first `count` slots' inputs made visible to the server (`Slots.stage`), inside the window; its ms,
        timed on our own stream (GPU) or by our clock (CPU)."""
        if not self.cuda:
            t0 = self.clock()
            slots.stage(count)
            return (self.clock() - t0) * 1e3
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        slots.stage(count)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def _check_timed(self, sh: dict, slots: Slots, init: list, seed0: int, seeds: list[int], sums: list,
                     sample: dict, outs: list[list]) -> int:
        """The secret sample of one batch's calls, checked on the copies taken right after the window; then the
        outputs must still be what they were (final bytes)."""
        shape = sh["shape"]
        for j, copies in sample.items():
            where = f"in a timed call at shape {shape['name']} ({_sizes_text(shape['sizes'])})"
            with self._spending("checks.draw_inputs"):
                args = make_inputs(self.spec, self.task, shape, seeds[j])
                changed = slots.mutated(j, args)
            if changed:
                raise Rejected(Verdict.INPUT_MUTATED, Stage.TIMING, f"forward modified input(s) {changed} in place "
                               f"{where}")
            elements = None if self._whole_check_due else self.checked_elements
            self._whole_check_due = False
            self._compare(sh, init, seed0, args, copies, where, Verdict.TIMED_OUTPUT_MISMATCH, elements)
            if any(not _same(a, b) for a, b in zip(outs[j], copies)):
                raise Rejected(Verdict.DEFERRED_WORK, Stage.TIMING, f"a timed call's output changed after the kernel "
                               f"server answered {where}")
        if not sample:
            time.sleep(SETTLE_S)
        if _checksums(outs) != sums:
            raise Rejected(Verdict.DEFERRED_WORK, Stage.TIMING, f"outputs of timed calls at shape {shape['name']} "
                           "changed after the kernel server answered: work still running when it said it was done")
        return len(sample)

    def _energy(self, sh: dict, slots: Slots, k: int, cal: dict, p: float, read_cap_ms: float | None, init: list,
                seed0: int, windows: list, calls: int) -> tuple[dict, int]:
        """Energy per call from NVML's counter around the timed batches' windows (`windows`, `calls`: read outside
        them, since a read takes about a millisecond), topped up with batches more, checked as the timed ones are
        (calls that skip their work would spend less), while the windows add up to less than ENERGY_WINDOW_S. The
        windows hold our copy of the inputs too. Returns (the energy record, the calls checked)."""
        checked, extra = 0, 0
        while sum(w[1] for w in windows) < ENERGY_WINDOW_S and extra < ENERGY_MAX_BATCHES:
            _, _, seeds, sums, sample, outs = self._batch(slots, k, cal, p, read_cap_ms, energy=windows)
            if p:
                checked += self._check_timed(sh, slots, init, seed0, seeds, sums, sample, outs)
            calls += k
            extra += 1
        joules, seconds = sum(w[0] for w in windows) / 1e3, sum(w[1] for w in windows)
        return {"energy_j_per_call": joules / calls, "avg_power_w": joules / max(seconds, 1e-9),
                "energy_calls": calls, "energy_extra_batches": extra}, checked

    def _millijoules(self) -> int | None:
        if not self.cuda:
            return None
        if self._meter is None:
            from sandbox.harness.energy import EnergyMeter

            self._meter = EnergyMeter()
        return self._meter.millijoules()

    def _flush(self) -> None:
        """The L2 is the referee's business: emptied (a write larger than it) and its persisting lines reset
        before every timed batch, so no carve-out or warm cache survives from one batch to the next."""
        if not self.cuda:
            return
        import torch

        if self._flush_buffer is None:
            props = torch.cuda.get_device_properties(0)
            size = max(2 * getattr(props, "L2_cache_size", 64 << 20), 256 << 20)
            self._flush_buffer = torch.empty(size // 4, dtype=torch.int32, device="cuda")
        _reset_persisting_l2()
        self._flush_buffer.zero_()

    def _ceilings(self):
        import torch

        from sandbox.harness.ceilings import measure

        try:
            ceilings = measure()
        except Exception as exc:  # noqa: BLE001 - without ceilings there is no roofline; the task is fine
            ceilings = {"error": f"measuring the GPU's ceilings failed: {type(exc).__name__}: {exc}"[:500]}
        torch.cuda.empty_cache()
        self.stages.done("ceilings")
        return ceilings


def _reset_persisting_l2() -> None:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return
    runtime.cudaCtxResetPersistingL2Cache()


def spec_seed(spec: dict) -> int:
    return spec["seeds"][0]


def _same(a, b) -> bool:
    import torch

    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _iqr(samples: list[float]) -> float:
    if len(samples) < 2:
        return 0.0
    q = statistics.quantiles(samples, n=4)
    return q[2] - q[0]


def _sizes_text(sizes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:  # noqa: BLE001 - our bug: say so on stderr, exit non-zero
        traceback.print_exc()
        sys.exit(70)
