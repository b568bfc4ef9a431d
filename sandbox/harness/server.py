"""The kernel server: the candidate's process (or a baseline's), serving calls the referee asks for.

    python -m sandbox.harness.server DEVICE        the socket to the referee is fd $APPLIANCE_REFEREE_FD

It holds no inputs of its own, no clock, no result file and no device turns: the referee (sandbox/harness/
referee.py) puts fresh inputs in shared buffers, sends "call", and times the round trip; the outputs are copied into
the referee's buffers. Nothing here is believed: a candidate that rewrites this file's code in its process can only
change what lands in those buffers and how long it takes, and both are the referee's to judge. What it reports of
its own failures (the stage and the exception) fails it, and is fed back to the proposer as untrusted text.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import traceback

from sandbox import protocol
from sandbox.harness.common import (as_outputs, error_info, is_compile_error, load_module, prepare_device,
                                    settle_cpu_math)
from sandbox.protocol import Stage, Verdict

ENV_FD = "APPLIANCE_REFEREE_FD"


class Failure(Exception):
    def __init__(self, verdict: Verdict, stage: Stage, reason: str, info: dict | None = None):
        super().__init__(reason)
        self.verdict, self.stage, self.reason, self.info = verdict, stage, reason, info or {}

    def answer(self) -> dict:
        return {"ok": False, "failure": {"verdict": self.verdict, "stage": self.stage, "reason": self.reason,
                                         **{k: self.info.get(k) for k in ("type", "traceback", "line")}}}


def main(argv: list[str]) -> int:
    device = argv[0]
    prepare_device(device)
    sock = socket.socket(fileno=int(os.environ.pop(ENV_FD)))
    import torch  # noqa: F401 - before the candidate: its import is the load stage, not ours

    settle_cpu_math()

    from sandbox.builds import keep_trusted_pch
    from sandbox.harness.provenance import Launches

    launches = Launches()
    launches.install()  # before the candidate is imported: its load_inline modules get counted too
    keep_trusted_pch()
    server = Server(device, launches)
    spin_s = SPIN_S if device.startswith("cuda") else 0.0  # on the CPU a spinning server takes the referee's core
    while True:
        try:
            message, fds = protocol.receive(sock, spin_s)
        except EOFError:
            return 0
        op = message.get("op")
        if op == "exit":
            return 0
        try:
            answer = server.handle(op, message, fds)
        except Failure as f:
            answer = f.answer()
        protocol.send(sock, answer)


SPIN_S = 1.0  # how long the server polls for the referee's next request before it blocks (GPU only): the
# referee's work between two timed batches (fresh inputs, checks) takes milliseconds to a second


class Slots:
    """A set of calls the referee laid out: each call's arguments (views of its input buffers, or plain values), its
    out buffers, and the outputs' expected dtypes and shapes."""

    def __init__(self, server: Server, calls: list[dict], outputs: list[dict]):
        self.args = [[server.view(a["buffer"]) if "buffer" in a else a["value"] for a in c["args"]] for c in calls]
        self.outs = [[server.view(o) for o in c["outs"]] for c in calls]
        self.expected = [(str(o["dtype"]), tuple(int(n) for n in o["shape"])) for o in outputs]


class Server:
    def __init__(self, device: str, launches):
        import torch

        self.device, self.launches = device, launches
        self.cuda = device.startswith("cuda")
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.pools: dict[str, object] = {}
        self.slots: dict[str, Slots] = {}
        self.arena = None  # on a GPU, where the calls' allocations come from (arena.py)
        self.arena_failed = False  # a forward ran out of the arena once: its allocations go elsewhere since
        self.cls = self.model = None
        self.path, self.compile = "", False
        self.results: list = []  # the last call's outputs, alive until the next call (the referee reads them)
        self._tiny = None

    def handle(self, op: str, message: dict, fds: list[int]) -> dict:
        if op == "load":
            self.path, self.compile = message["file"], bool(message.get("compile"))
            self.cls = self._load_class(self.path, message["cls"])
        elif op == "pool":
            from sandbox.harness.shared import Pool

            name = message["name"]
            self.slots = {k: v for k, v in self.slots.items() if k != name}
            self.results = []
            old = self.pools.pop(name, None)
            if old is not None:
                old.close()
            self.pools[name] = Pool.attach(self.device, fds[0], message["nbytes"])
        elif op == "arena":
            self._make_arena(self.pools[message["pool"]])
        elif op == "slots":
            self.slots[message["name"]] = Slots(self, message["calls"], message["outputs"])
        elif op == "build":
            self.results = []
            self.model = self._build(message["init"], message["seed"], message.get("dtype"))
        elif op == "call":
            slots = self.slots[message["slots"]]
            return self._calls(slots, int(message.get("count", len(slots.args))), bool(message.get("record")),
                               bool(message.get("profile")))
        elif op == "tiny":
            if self.cuda:
                if self._tiny is None:
                    import torch

                    self._tiny = torch.zeros(1, device=self.device)
                self._tiny.add_(1)
            self.sync()
        return {"ok": True}

    def view(self, ref: dict):
        return self.pools[ref["pool"]].tensor(ref["entry"])

    def _make_arena(self, pool) -> None:
        from sandbox.harness.arena import Arena

        try:
            self.arena = Arena(pool.device_pointer(), pool.nbytes)
        except Exception as exc:  # noqa: BLE001 - no custom allocator here (ctypes, torch): outputs are copied
            print(f"kernel server: no arena allocator ({type(exc).__name__}: {exc}); outputs are copied",
                  file=sys.stderr)

    def _load_class(self, path: str, name: str) -> type:
        try:
            module = load_module(path, "candidate" if name == "ModelNew" else "task")
        except BaseException as exc:  # noqa: BLE001 - SystemExit from the candidate is a load failure too
            raise _failure(exc, Stage.LOAD, "while importing", path) from None
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            raise Failure(Verdict.LOAD_ERROR, Stage.LOAD, f"candidate defines no class {name} (KernelBench convention)")
        return cls

    def _build(self, init: list, seed: int, dtype: str | None):
        import torch

        torch.manual_seed(seed)
        try:
            model = self.cls(*init).to(self.device)
            if dtype:
                model = model.to(getattr(torch, dtype))
            if self.compile:
                model = torch.compile(model)
        except BaseException as exc:  # noqa: BLE001
            raise _failure(exc, Stage.LOAD, f"in {self.cls.__name__}(*init_inputs)", self.path) from None
        return model

    def _calls(self, slots: Slots, count: int, record: bool, profile: bool) -> dict:
        import torch

        self.results = []  # the last batch's outputs: read by the referee; their memory is for this batch
        ops: set[str] = set()
        # Own kernel launches are counted in every call (the count costs a Python call per launch); the ATen ops
        # only in correctness calls ("record"): a dispatch mode adds microseconds to every op.
        self.launches.count, self.launches.active = 0, True
        stage = Stage.CORRECTNESS if record else Stage.TIMING
        if profile:
            torch.cuda.cudart().cudaProfilerStart()
        try:
            try:
                placed = self._serve(slots, count, record, ops, stage)
            except torch.OutOfMemoryError:
                if self.arena is None or self.arena_failed:
                    raise
                self.results, self.arena_failed = [], True  # the arena holds outputs and some workspace, not all
                placed = self._serve(slots, count, record, ops, stage)
        except Failure:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise _failure(exc, stage, "in forward", self.path) from None
        finally:
            self.launches.active = False
            if profile:
                torch.cuda.cudart().cudaProfilerStop()
        return {"ok": True, "launches": self.launches.count, "outputs": placed} | (
            {"ops": sorted(ops)} if record else {})

    def _serve(self, slots: Slots, count: int, record: bool, ops: set, stage: Stage) -> list[list[dict]]:
        """The set's first `count` calls, each one's outputs placed before the next one runs, then the device
        synchronised (kernel faults surface there, attributed to these calls)."""
        import contextlib

        import torch

        from sandbox.harness.provenance import record_ops

        in_arena = self.arena is not None and not self.arena_failed
        placed, spans = [], []
        with torch.no_grad(), self.arena.allocating() if in_arena else contextlib.nullcontext():
            for j, args in enumerate(slots.args[:count]):
                if record:
                    result, seen = record_ops(self.model, *args)
                    ops.update(seen)
                else:
                    result = self.model(*args)
                self.results.append(result)
                placed.append(self._place(result, slots, j, spans, stage))
        self.sync()
        return placed

    def _place(self, result, slots: Slots, j: int, spans: list, stage: Stage) -> list[dict]:
        """Where call j's outputs are for the referee: where forward made them, when that is in the arena (the
        GPU's fast path: nothing is copied), else copied into the call's out buffers. Checked first, so that an
        honest mistake gets a clear verdict here rather than a wrong-output one there."""
        row = []
        for i, out in enumerate(self._checked(result, slots.expected)):
            offset = self.arena.offset_of(out) if self.arena is not None else None
            if offset is None:
                slots.outs[j][i].copy_(out)
                row.append({"slot": True})
                continue
            end = offset + out.numel() * out.element_size()
            if any(a < end and offset < b for a, b in spans):
                raise Failure(Verdict.WRONG_OUTPUT, stage, "forward returned memory it had returned for an earlier "
                              "call (a buffer it keeps and reuses): every call's output must be a tensor of its own, "
                              "or earlier calls' outputs are overwritten")
            spans.append((offset, end))
            row.append({"offset": offset})
        return row

    @staticmethod
    def _checked(result, expected: list[tuple[str, tuple]]) -> tuple:
        """One call's outputs, as plain tensors of the reference's shapes and dtypes."""
        import torch

        outs = as_outputs(result)
        if outs is None:
            raise Failure(Verdict.WRONG_OUTPUT, Stage.CORRECTNESS,
                          f"forward returned {type(result).__name__}, expected tensor(s)")
        if len(outs) != len(expected):
            raise Failure(Verdict.WRONG_SHAPE, Stage.CORRECTNESS,
                          f"forward returned {len(outs)} output(s), expected {len(expected)}")
        for i, (out, (dtype, shape)) in enumerate(zip(outs, expected)):
            label = f"output {i}" if len(expected) > 1 else "output"
            if type(out) is not torch.Tensor:
                raise Failure(Verdict.WRONG_OUTPUT, Stage.CORRECTNESS,
                              f"forward returned a tensor subclass ({type(out).__name__}): only plain torch.Tensor "
                              "outputs are accepted")
            if tuple(out.shape) != shape:
                raise Failure(Verdict.WRONG_SHAPE, Stage.CORRECTNESS,
                              f"{label} has shape {tuple(out.shape)}, expected {shape}")
            if str(out.dtype).removeprefix("torch.") != dtype:
                raise Failure(Verdict.WRONG_DTYPE, Stage.CORRECTNESS,
                              f"{label} has dtype {str(out.dtype).removeprefix('torch.')}, expected {dtype}")
        return outs


def _refused_by_jail(exc: BaseException | None) -> bool:
    """EPERM/EACCES/EROFS: the jail said no (seccomp, read-only or invisible paths). Honest kernels never need
    anything that ends this way."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _failure(exc: BaseException, stage: Stage, what: str, path: str) -> Failure:
    info = error_info(exc, path)
    where = f"candidate.py line {info['line']}" if info["line"] else "candidate"
    short = info["type"].rsplit(".", 1)[-1]
    if _refused_by_jail(exc):
        return Failure(Verdict.SANDBOX_VIOLATION, stage, f"the jail refused an operation {what} ({where}): "
                       f"{short}: {info['message'][:600]}", info)
    if isinstance(exc, SyntaxError):
        return Failure(Verdict.LOAD_ERROR, Stage.LOAD, f"syntax error in {where}: {exc.msg}", info)
    if is_compile_error(exc):
        return Failure(Verdict.COMPILE_ERROR, Stage.COMPILE, f"kernel build failed {what} ({where}): {short}: "
                       f"{info['message'][:600]}", info)
    verdict = Verdict.LOAD_ERROR if stage == Stage.LOAD else Verdict.RUNTIME_ERROR
    return Failure(verdict, stage, f"{short} {what} ({where}): {info['message'][:600]}", info)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:  # noqa: BLE001 - our bug (or a candidate that broke the server): exit non-zero
        traceback.print_exc()
        sys.exit(70)
