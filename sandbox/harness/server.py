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
from sandbox.harness.common import as_outputs, error_info, is_compile_error, load_module, prepare_device
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

    from sandbox.harness.provenance import Launches

    launches = Launches()
    launches.install()  # before the candidate is imported: its load_inline modules get counted too
    server = Server(device, launches)
    while True:
        try:
            message, fds = protocol.receive(sock)
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


class Server:
    def __init__(self, device: str, launches):
        import torch

        self.device, self.launches = device, launches
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self.pools: dict[str, object] = {}
        self.views: dict[tuple, object] = {}
        self.cls = self.model = None
        self.path, self.compile = "", False
        self.pending: list[tuple] = []  # (forward's result, the buffers it goes to) until "land"

    def handle(self, op: str, message: dict, fds: list[int]) -> dict:
        if op == "load":
            self.path, self.compile = message["file"], bool(message.get("compile"))
            self.cls = self._load_class(self.path, message["cls"])
        elif op == "pool":
            from sandbox.harness.shared import Pool

            old = self.pools.pop(message["name"], None)
            if old is not None:
                self.views = {k: v for k, v in self.views.items() if k[0] != message["name"]}
                old.close()
            self.pools[message["name"]] = Pool.attach(self.device, fds[0], message["nbytes"])
        elif op == "build":
            self.model = self._build(message["init"], message["seed"], message.get("dtype"))
        elif op == "call":
            return self._calls(message["calls"], bool(message.get("record")), bool(message.get("profile")))
        elif op == "land":
            self._land_pending()
        elif op == "empty":
            self.sync()
        return {"ok": True}

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

    def _view(self, ref: dict):
        key = (ref["pool"], ref["entry"]["offset"], ref["entry"]["dtype"], tuple(ref["entry"]["shape"]),
               tuple(ref["entry"]["strides"]))
        if key not in self.views:
            self.views[key] = self.pools[ref["pool"]].tensor(ref["entry"])
        return self.views[key]

    def _calls(self, calls: list[dict], record: bool, profile: bool) -> dict:
        import torch

        from sandbox.harness.provenance import record_ops

        ops: set[str] = set()
        # Own kernel launches are counted in every call (the count costs a Python call per launch); the ATen ops
        # only in correctness calls ("record"): a dispatch mode adds microseconds to every op.
        self.launches.count, self.launches.active = 0, True
        if profile:
            torch.cuda.cudart().cudaProfilerStart()
        try:
            with torch.no_grad():
                for call in calls:
                    args = [self._view(a["buffer"]) if "buffer" in a else a["value"] for a in call["args"]]
                    if record:
                        result, seen = record_ops(self.model, *args)
                        ops.update(seen)
                    else:
                        result = self.model(*args)
                    self.pending.append((result, [self._view(o) for o in call["outs"]]))
            self.sync()  # kernel faults surface here, attributed to these calls
        except Failure:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise _failure(exc, Stage.CORRECTNESS if record else Stage.TIMING, "in forward", self.path) from None
        finally:
            self.launches.active = False
            if profile:
                torch.cuda.cudart().cudaProfilerStop()
        return {"ok": True, "launches": self.launches.count} | ({"ops": sorted(ops)} if record else {})

    def _land_pending(self) -> None:
        """The outputs of the calls served since the last "land", copied into the referee's buffers (it times this
        too, and charges whatever it takes beyond the trusted server's copy: nothing is gained by working here)."""
        pending, self.pending = self.pending, []
        try:
            for result, buffers in pending:
                self._land(result, buffers)
            self.sync()
        except Failure:
            raise
        except BaseException as exc:  # noqa: BLE001 - a lazy output that fails when copied fails the call
            raise _failure(exc, Stage.CORRECTNESS, "while its outputs were collected", self.path) from None

    def _land(self, result, buffers: list) -> None:
        """One call's outputs copied into the referee's buffers, which have the reference's dtypes and shapes."""
        import torch

        outs = as_outputs(result)
        if outs is None:
            raise Failure(Verdict.WRONG_OUTPUT, Stage.CORRECTNESS,
                          f"forward returned {type(result).__name__}, expected tensor(s)")
        if len(outs) != len(buffers):
            raise Failure(Verdict.WRONG_SHAPE, Stage.CORRECTNESS,
                          f"forward returned {len(outs)} output(s), expected {len(buffers)}")
        for i, (out, buf) in enumerate(zip(outs, buffers)):
            label = f"output {i}" if len(buffers) > 1 else "output"
            if type(out) is not torch.Tensor:
                raise Failure(Verdict.WRONG_OUTPUT, Stage.CORRECTNESS,
                              f"forward returned a tensor subclass ({type(out).__name__}): only plain torch.Tensor "
                              "outputs are accepted")
            if tuple(out.shape) != tuple(buf.shape):
                raise Failure(Verdict.WRONG_SHAPE, Stage.CORRECTNESS,
                              f"{label} has shape {tuple(out.shape)}, expected {tuple(buf.shape)}")
            if out.dtype != buf.dtype:
                raise Failure(Verdict.WRONG_DTYPE, Stage.CORRECTNESS,
                              f"{label} has dtype {str(out.dtype).removeprefix('torch.')}, expected "
                              f"{str(buf.dtype).removeprefix('torch.')}")
            buf.copy_(out)


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
