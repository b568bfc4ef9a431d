"""Evaluation worker processes: one per evaluation GPU (or one for the CPU), each serving evaluations on a socket.

`appliance worker --gpu N` builds a local `Pipeline` (jail, harness, device turns) for GPU N and serves it on
`APPLIANCE_HOME/workers/gpuN.sock` (`cpu.sock` for `--gpu cpu`), with the standard library's
`multiprocessing.connection`. Only the appliance's user can submit: the socket's directory is 0700, and every
connection must prove it knows the key in `APPLIANCE_HOME/workers/authkey` (created 0600 by whoever needs it first).

Protocol: one connection per request, a thread per connection. `evaluate` carries the task's text (name, source,
manifest, path), the candidate's text and the run's `EvalSettings` (mode, baselines, timing budget, ...): the
settings travel with every request because the controller decides them per run, and a worker outlives runs (a
systemd worker outlives controllers). The worker keeps one `Pipeline` per distinct settings, all sharing one set of
device turns, so evaluations of two runs on one GPU still never overlap a measurement; at most `--slots` evaluations
run at once and more wait their turn. The reply is the `Outcome`, or our own errors as values (TaskError,
InfrastructureError). Whether to profile a passing candidate is the search's decision, which reads the database (it
stays with the controller): the request carries its threshold (`profile_above`, pipeline.SentThreshold). Jail or no jail is the worker's own setting, never a request's.

Clients: `WorkerSupervisor.pipelines()` gives one `WorkerPipeline` per GPU, a `Pipeline` look-alike (as
appliance/ray_executor.py's `RayPipeline`). A worker already answering on a GPU's socket (systemd's
`appliance-worker@N`) is used as it is; otherwise the supervisor starts `python -m appliance worker` as a child and
starts it again whenever it dies. A worker that dies mid-evaluation fails that evaluation with InfrastructureError
(the loop re-queues it once); the next one waits for the restarted worker (APPLIANCE_WORKER_TIMEOUT seconds,
default 120).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Callable

from appliance.errors import EvaluationCancelled, InfrastructureError, TaskError
from appliance.evaluation.job_folders import JobFolder
from appliance.config import Settings
from appliance.evaluation.pipeline import EvalSettings, Outcome, Pipeline, SentThreshold, evaluate_sent, sent_threshold
from appliance.tasks import RebuiltTasks, Task, task_files

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, the last one a NUL
KEPT_PIPELINES = 4  # settings a worker keeps pipelines (and their reused inputs) for; idle ones beyond are closed


def label(gpu: int | None) -> str:
    return "cpu" if gpu is None else f"gpu{gpu}"


def parse_gpu(value: str) -> int | None:
    """`--gpu 3` or `--gpu cpu` (a systemd instance name: appliance-worker@3, appliance-worker@cpu)."""
    if value == "cpu":
        return None
    if value.isdigit():
        return int(value)
    raise ValueError(f"--gpu takes a GPU index (nvidia-smi numbering) or cpu, not {value!r}")


def workers_dir(home: Path) -> Path:
    d = home / "workers"
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)  # nobody else may even reach the sockets
    return d


def socket_path(home: Path, gpu: int | None) -> Path:
    return workers_dir(home) / f"{label(gpu)}.sock"


def authkey(home: Path) -> bytes:
    """The shared secret of this appliance's workers and their clients: created once, 0600, atomically (written to
    a private file, then linked into place, so nobody ever reads a half-written key)."""
    path = workers_dir(home) / "authkey"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".authkey-")  # mkstemp creates it 0600
        try:
            os.write(fd, secrets.token_hex(32).encode())
            os.close(fd)
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            os.unlink(tmp)
    mode = path.stat().st_mode
    if mode & 0o077:
        raise InfrastructureError(f"{path} is readable by other users (mode {stat.S_IMODE(mode):o}): anyone who reads "
                                  f"it can submit code to the evaluation workers. chmod 600 {path}")
    return path.read_bytes().strip()


# --- the worker process ---------------------------------------------------------------------------------------------


class _Stop(Exception):
    """Raised in the accept loop by SIGTERM/SIGINT."""


class WorkerServer:
    def __init__(self, gpu: int | None, path: Path, slots: int, unsafe: bool, home: Path, jobs_dir: Path,
                 log: Callable[[str], None], host_memory_bytes: int | None = None, jail=None):
        from sandbox.jail import Jail

        self.gpu, self.path, self.slots, self.home, self.jobs_dir, self.log = gpu, path, slots, home, jobs_dir, log
        self.host_memory_bytes = host_memory_bytes  # this host's (APPLIANCE_HOST_MEMORY_GIB), not the client's
        self.key = authkey(home)
        self.jail = jail or Jail(unsafe_no_jail=unsafe, gpu=gpu)  # the host's limits (Settings.jail)
        self.host = socket.gethostname()
        self.free = threading.BoundedSemaphore(slots)  # evaluations at once; the rest wait for a free one
        self.lock = threading.Lock()
        self.pipelines: dict[str, Pipeline] = {}  # settings -> pipeline, oldest first
        self.users: Counter[str] = Counter()  # settings -> evaluations in flight
        self.called_off: dict[str | None, float] = {}  # client -> when its run called off what was not measuring
        self.gate = None  # the device's turns, shared by every pipeline of this worker
        self.host_memory = None  # and the host memory its evaluations may hold
        self.tasks: RebuiltTasks | None = None  # set with self.dir, in serve()
        self.profile_if = SentThreshold()  # every pipeline here: the threshold each request brings
        self.idle = threading.Condition()
        self.in_flight = 0
        self.stopping = False  # set (under self.idle) once the worker stops taking work
        self.dir: Path | None = None

    # The accept loop runs in the main thread, where SIGTERM interrupts it; each connection gets a thread.
    def serve(self, parent: int | None = None) -> None:
        self.jail.check()  # fail closed now, not on the first candidate (JailUnavailable: the caller says why)
        claim_socket(self.path, self.key, self.log)
        folder = JobFolder(self.jobs_dir)  # swept by the next worker if this one is killed
        self.dir = folder.path
        self.tasks = RebuiltTasks(self.dir / "task")
        try:
            listener = Listener(str(self.path), "AF_UNIX", backlog=64)  # the handshake is per connection, below
        except OSError as e:
            folder.release()
            raise InfrastructureError(f"cannot listen on {self.path}: {e}") from None
        os.chmod(self.path, 0o600)

        def stop(*_):
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)  # a second signal ends the worker at once
            raise _Stop

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)
        try:
            if parent:
                threading.Thread(target=self._watch_parent, args=(parent,), daemon=True).start()
            self.log(f"serving {label(self.gpu)} on {self.path} (pid {os.getpid()}, {self.slots} evaluation(s) at "
                     f"once, {'UNJAILED' if self.jail.unsafe_no_jail else 'jailed'})")
            _sd_notify(f"READY=1\nSTATUS=serving {label(self.gpu)} on {self.path}")
            while True:
                conn = listener.accept()
                threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()
        except _Stop:
            pass
        finally:
            _sd_notify("STOPPING=1")
            try:
                listener.close()  # also removes the socket file
            except OSError:
                pass
            with self.idle:
                self.stopping = True
                if self.in_flight:
                    self.log(f"stopping: finishing {self.in_flight} evaluation(s) in flight")
                self.idle.wait_for(lambda: self.in_flight == 0)
            for p in self.pipelines.values():
                p.close()
            folder.release()
            self.log("stopped")

    def _watch_parent(self, parent: int) -> None:
        """A worker its supervisor started outlives it only until it notices: nobody would read its results."""
        while os.getppid() == parent:
            time.sleep(1.0)
        self.log(f"supervisor (pid {parent}) is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    def _serve_one(self, conn: Connection) -> None:
        with conn:
            try:  # what Listener(authkey=...) does in accept(), here so a slow client cannot hold up the others
                deliver_challenge(conn, self.key)
                answer_challenge(conn, self.key)
            except AuthenticationError:
                self.log("refused a connection with the wrong authkey")
                return
            except (EOFError, OSError):
                return  # a probe (claim_socket of another worker) or a client that gave up
            try:
                request = conn.recv()
                op = request.get("op")
                if op == "ping":
                    conn.send(self.status())
                elif op == "evaluate":
                    conn.send(self._evaluate(conn, request))
                elif op == "prepare":
                    conn.send(self._prepare(request))
                elif op == "cancel_unmeasured":
                    conn.send(self._cancel_unmeasured(request))
                elif op == "release":
                    self._release(request["settings"])
                    conn.send({"ok": True})
                else:
                    conn.send({"bug": f"unknown request {op!r}"})
            except (EOFError, OSError):
                self.log("a client went away before its reply (its controller stopped?)")

    def status(self) -> dict:
        return {"pid": os.getpid(), "gpu": self.gpu, "host": self.host, "slots": self.slots,
                "unsafe_no_jail": self.jail.unsafe_no_jail, "in_flight": self.in_flight}

    def _evaluate(self, conn: Connection, request: dict) -> dict:
        asked_at = time.monotonic()
        with self.free:
            with self.idle:
                if self.stopping:  # waited for a slot while the worker was told to stop: nothing may start now
                    return {"infrastructure_error": "the worker is stopping"}
                if asked_at <= self.called_off.get(request.get("client"), -1.0):  # waited while its run's time ran out
                    return {"cancelled": "called off before it started"}
                self.in_flight += 1
            key = None
            try:
                key, pipeline = self._acquire(request["settings"])
                self.profile_if.set(request.get("profile_above"), request.get("task"))
                outcome = evaluate_sent(pipeline, self.tasks, request["task"], request["source"], request["path"],
                                        self.dir, tag=request.get("client"), asked_at=asked_at)
            except EvaluationCancelled as e:
                return {"cancelled": str(e)}
            except TaskError as e:
                return {"task_error": [e.path, e.message, e.line]}
            except InfrastructureError as e:
                return {"infrastructure_error": str(e)}
            except Exception:  # noqa: BLE001 - a bug of ours: the client raises it as loudly as a local pipeline
                self.log(f"evaluation failed:\n{traceback.format_exc()}")
                return {"bug": traceback.format_exc()}
            finally:
                self._finished(key)
        outcome.details |= {"host": self.host, "worker_pid": os.getpid()}
        return {"outcome": outcome}

    def _cancel_unmeasured(self, request: dict) -> dict:
        """One client's evaluations here that do not measure yet, called off (its run's time is up)."""
        key = json.dumps(request["settings"], sort_keys=True, default=str)
        with self.lock:
            self.called_off[request.get("client")] = time.monotonic()  # (its requests still waiting for a slot)
            pipeline = self.pipelines.get(key)
        return {"cancelled": pipeline.cancel_unmeasured(request.get("client")) if pipeline else 0}

    def _prepare(self, request: dict) -> dict:
        """The task's inputs and baselines made now, before the run's first candidate here. A failure is only
        logged: the evaluations that follow meet it again and report it."""
        with self.idle:
            if self.stopping:
                return {"ok": False, "error": "the worker is stopping"}
            self.in_flight += 1
        key = None
        try:
            key, pipeline = self._acquire(request["settings"])
            pipeline.prepare(self.tasks.get(request["task"]))
            return {"ok": True}
        except (TaskError, InfrastructureError) as e:
            return {"ok": False, "error": str(e)}
        finally:
            self._finished(key)

    def _finished(self, key: str | None) -> None:
        """A request is over: its pipeline's users and the worker's requests in flight count it no more."""
        if key is not None:
            with self.lock:
                self.users[key] -= 1
        with self.idle:
            self.in_flight -= 1
            self.idle.notify_all()

    def _acquire(self, fields: dict) -> tuple[str, Pipeline]:
        key = json.dumps(fields, sort_keys=True, default=str)
        with self.lock:
            pipeline = self.pipelines.get(key)
            if pipeline is None:
                try:
                    # Jobs and kept inputs under this worker's own directory: removed when it stops.
                    settings = EvalSettings(**fields, jobs_dir=self.dir, state_dir=self.home,
                                            host_memory_bytes=self.host_memory_bytes)
                except TypeError as e:
                    raise InfrastructureError(f"the worker on {self.path} runs another version of the appliance "
                                              f"({e}): restart it") from None
                if (self.gpu is None) != (settings.device == "cpu"):
                    raise InfrastructureError(f"a {settings.device} evaluation was sent to the worker of "
                                              f"{label(self.gpu)} ({self.path})")
                pipeline = Pipeline(self.jail, settings, self.slots)
                if self.gate is None:
                    self.gate, self.host_memory = pipeline.gate, pipeline.host_memory
                pipeline.gate = self.gate  # one device, one set of turns: no run measures over another's work
                pipeline.host_memory = self.host_memory
                pipeline.profile_if = self.profile_if
                self.pipelines[key] = pipeline
                idle = [k for k in self.pipelines if k != key and not self.users[k]]  # oldest first
                for old in idle[:max(0, len(self.pipelines) - KEPT_PIPELINES)]:
                    self.pipelines.pop(old).close()
            self.users[key] += 1
            return key, pipeline

    def _release(self, fields: dict) -> None:
        """A run is over: drop the inputs its pipeline kept, unless another client is using the same settings."""
        key = json.dumps(fields, sort_keys=True, default=str)
        with self.lock:
            if key in self.pipelines and not self.users[key]:
                self.pipelines.pop(key).close()


def claim_socket(path: Path, key: bytes, log: Callable[[str], None] = lambda _: None) -> None:
    """Make `path` free for a new worker: refuse if a live process listens there, remove a dead worker's file."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise InfrastructureError(f"socket path too long for a Unix socket ({len(os.fsencode(path))} bytes, at most "
                                  f"{MAX_SOCKET_PATH}): {path}. Pass --socket, or use a shorter APPLIANCE_HOME")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise InfrastructureError(f"{path} exists and is not a socket: remove it, or pass another --socket")
    try:
        info = call(path, key, {"op": "ping"})
    except AuthenticationError:
        raise InfrastructureError(f"{path} is in use by a live process with another authkey (a worker of another "
                                  "APPLIANCE_HOME?): stop it, or pass another --socket") from None
    if info is not None:
        raise InfrastructureError(f"{path} is in use by a live worker (pid {info['pid']}, {label(info['gpu'])}): stop "
                                  "it first (systemctl stop appliance-worker@N, or its supervisor), or pass "
                                  "another --socket")
    with socket.socket(socket.AF_UNIX) as probe:  # no answer to a ping: is anything listening at all?
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            try:
                path.unlink()
                log(f"removed a stale socket {path} (a worker that died without cleaning up)")
            except FileNotFoundError:
                pass
            return
    raise InfrastructureError(f"{path} accepts connections but does not answer: a wedged worker? Stop it, or pass "
                              "another --socket")


def call(path: Path, key: bytes, request: dict, timeout: float = 5.0) -> dict | None:
    """A short request (ping, release): the reply, or None when nobody answers within `timeout` (a stopped or
    wedged worker must not hang its caller). Raises AuthenticationError for a worker with another key."""
    box: dict = {}

    def go():
        try:
            with Client(str(path), "AF_UNIX", authkey=key) as conn:
                conn.send(request)
                if conn.poll(timeout):
                    box["reply"] = conn.recv()
        except AuthenticationError as e:
            box["auth"] = e
        except (OSError, EOFError):
            pass

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    if "auth" in box:
        raise box["auth"]
    return box.get("reply")


def _sd_notify(state: str) -> None:
    """Tell systemd (Type=notify) we listen: units ordered after a worker start once it can take requests."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(address)
            s.sendall(state.encode())
    except OSError:
        pass


# --- the client side: supervisor and pipeline proxy -----------------------------------------------------------------


@dataclasses.dataclass
class _Worker:
    gpu: int | None
    path: Path
    slots: int
    unsafe: bool
    proc: subprocess.Popen | None = None  # None: someone else's worker (systemd), used as it is
    started: float = 0.0
    restart_at: float | None = None  # when a dead child may be started again
    delay: float = 0.0  # back-off for a child that keeps dying right after its start

    @property
    def name(self) -> str:
        return label(self.gpu)

    @property
    def unit(self) -> str:
        return f"appliance-worker@{'cpu' if self.gpu is None else self.gpu}"

    def describe(self) -> str:
        owner = f"pid {self.proc.pid}, started by this process" if self.proc else f"{self.unit} or started by hand"
        return f"evaluation worker {self.name} ({owner}; {self.path})"


class WorkerSupervisor:
    """The evaluation workers of this host, by GPU. `persistent` (the controller): the workers it started live until
    `close()`, across runs; otherwise (`optimize --executor workers`) they stop when the last pipeline is closed."""

    def __init__(self, home: Path, metrics=None, log: Callable[[str], None] | None = None, persistent: bool = False):
        self.home, self.metrics, self.persistent = home, metrics, persistent
        self.log = log or (lambda line: print(f"workers: {line}", file=sys.stderr, flush=True))
        self.key = authkey(home)
        self.timeout_s = Settings.load().worker_timeout_s
        self.workers: dict[int | None, _Worker] = {}
        self.open: set[int] = set()  # ids of the pipelines handed out and not closed yet
        self.lock = threading.RLock()
        self.closing = threading.Event()
        self.monitor: threading.Thread | None = None
        atexit.register(self.close)

    def pipelines(self, gpus: list[int | None], settings: EvalSettings, slots: int, unsafe: bool) -> list:
        with self.lock:
            workers = [self._worker(g, slots, unsafe) for g in gpus]  # start them all, then wait for each
        pipelines = []
        for w in workers:
            info = self.wait_ready(w, time.monotonic() + self.timeout_s)
            if info["gpu"] != w.gpu:
                raise InfrastructureError(f"{w.describe()} serves {label(info['gpu'])}, not {w.name}")
            if info["unsafe_no_jail"] and not unsafe:
                raise InfrastructureError(f"{w.describe()} runs candidates WITHOUT the jail (--unsafe-no-jail) and "
                                          "this run wants them jailed: restart it without that flag")
            p = WorkerPipeline(self, w, settings, slots, unsafe_no_jail=info["unsafe_no_jail"])
            self.open.add(id(p))
            pipelines.append(p)
        if self.monitor is None:
            self.monitor = threading.Thread(target=self._watch, daemon=True)
            self.monitor.start()
        return pipelines

    def _worker(self, gpu: int | None, slots: int, unsafe: bool) -> _Worker:
        w = self.workers.get(gpu)
        if w is not None and w.proc is None and call(w.path, self.key, {"op": "ping"}) is None:
            self.log(f"{w.describe()} no longer answers (its unit stopped?): starting a worker of our own")
            w = None
        if w is not None and w.proc is not None and (w.slots < slots or w.unsafe != unsafe):
            self.log(f"restarting {w.describe()} for this run's settings ({slots} slots, "
                     f"{'unjailed' if unsafe else 'jailed'})")
            self._stop(w)  # between runs: nothing is in flight
            w = None
        if w is None:
            w = self.workers[gpu] = _Worker(gpu, socket_path(self.home, gpu), slots, unsafe)
            info = call(w.path, self.key, {"op": "ping"}) if w.path.exists() else None
            if info is not None:
                self.log(f"using the worker already listening on {w.path} (pid {info['pid']})")
            else:
                self._spawn(w)
        return w

    def _spawn(self, w: _Worker) -> None:
        # The supervisor's flag decides the jail, never the environment (as for the in-process pipelines); its own
        # session keeps a Ctrl-C or the controller's SIGTERM away from evaluations in flight.
        env = {k: v for k, v in os.environ.items() if k not in ("APPLIANCE_UNSAFE_NO_JAIL", "NOTIFY_SOCKET")}
        env["APPLIANCE_HOME"] = str(self.home)
        cmd = [sys.executable, "-m", "appliance", "worker", "--gpu", "cpu" if w.gpu is None else str(w.gpu),
               "--socket", str(w.path), "--slots", str(w.slots), "--parent", str(os.getpid()),
               *(["--unsafe-no-jail"] if w.unsafe else [])]
        w.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        w.started, w.restart_at = time.monotonic(), None
        self.log(f"started {w.describe()}")

    def ensure(self, w: _Worker) -> None:
        """Start a child that died again (after a back-off when it keeps dying at once)."""
        with self.lock:
            if w.proc is None or self.closing.is_set() or w.proc.poll() is None or self.workers.get(w.gpu) is not w:
                return  # (the last: replaced for another run's settings; the monitor may still hold the old one)
            now = time.monotonic()
            if w.restart_at is None:
                w.delay = min(max(1.0, 2 * w.delay), 30.0) if now - w.started < 30 else 0.0
                w.restart_at = now + w.delay
                self.log(f"{w.describe()} exited ({_exit_status(w.proc.returncode)}); starting it again"
                         + (f" in {w.delay:.0f} s" if w.delay else ""))
                self._up(w, False)
            if now < w.restart_at:
                return
            info = call(w.path, self.key, {"op": "ping"}) if w.path.exists() else None
            if info is not None:  # systemd's worker took the socket meanwhile: use it instead
                self.log(f"using the worker now listening on {w.path} (pid {info['pid']})")
                w.proc = None
                return
            self._spawn(w)

    def wait_ready(self, w: _Worker, deadline: float) -> dict:
        while True:
            self.ensure(w)
            info = call(w.path, self.key, {"op": "ping"}) if w.path.exists() else None
            if info is not None:
                w.delay = 0.0
                self._up(w, True)
                return info
            if time.monotonic() > deadline:
                why = (f"exited ({_exit_status(w.proc.returncode)}; its error is in this log above)"
                       if w.proc is not None and w.proc.poll() is not None else "does not answer")
                hint = "" if w.proc else f" (systemctl status {w.unit})"
                raise InfrastructureError(f"{w.describe()} {why} after {self.timeout_s:.0f} s{hint}")
            time.sleep(0.1)

    def _watch(self) -> None:
        """Restart dead children as soon as they die, and keep appliance_workers_up{gpu} to the workers that answer."""
        tick = 0
        while not self.closing.wait(1.0):
            tick += 1
            for w in list(self.workers.values()):
                self.ensure(w)
                if tick % 5 == 0:
                    try:
                        self._up(w, call(w.path, self.key, {"op": "ping"}) is not None)
                    except AuthenticationError:
                        self._up(w, False)

    def _up(self, w: _Worker, up: bool) -> None:
        if self.metrics is not None:
            self.metrics.worker_up(w.gpu, up)

    def closed(self, pipeline: WorkerPipeline) -> None:
        self.open.discard(id(pipeline))
        if not self.persistent and not self.open:
            self.close()

    def close(self) -> None:
        """Stop the workers this supervisor started (systemd's keep running)."""
        self.closing.set()
        with self.lock:
            for w in self.workers.values():
                self._stop(w)
            self.workers.clear()

    def _stop(self, w: _Worker) -> None:
        if w.proc is None or w.proc.poll() is not None:
            return
        w.proc.terminate()  # it finishes what it has in flight (nothing, between runs) and removes its socket
        try:
            w.proc.wait(30)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        self._up(w, False)


class WorkerPipeline:
    """An Evaluator (evaluation/evaluator.py) whose evaluations run in one worker process. Thread-safe: `slots` loop threads call
    `evaluate` at once, each over its own connection."""

    def __init__(self, supervisor: WorkerSupervisor, worker: _Worker, settings: EvalSettings, slots: int,
                 unsafe_no_jail: bool):
        self.supervisor, self.worker, self.settings, self.slots = supervisor, worker, settings, max(1, slots)
        self.gpu, self.unsafe_no_jail = worker.gpu, unsafe_no_jail
        self.client = uuid.uuid4().hex  # its evaluations at the worker, which other runs may share
        self.profile_if: Callable[[float | None], bool] | None = None  # set by the loop; its threshold is sent
        # Paths are the worker's own (its APPLIANCE_HOME); everything else is the run's.
        self.fields = {k: v for k, v in dataclasses.asdict(settings).items()
                       if k not in ("jobs_dir", "state_dir", "host_memory_bytes")}  # the worker's host decides these

    def evaluate(self, task: Task, candidate_path: str | Path) -> Outcome:
        candidate_path = Path(candidate_path)
        if not candidate_path.is_file():
            raise TaskError(str(candidate_path), "no such candidate file")
        request = {"op": "evaluate", "client": self.client, "settings": self.fields,
                   "profile_above": sent_threshold(self.profile_if),
                   "task": task_files(task), "source": candidate_path.read_text(errors="replace"),
                   "path": str(candidate_path)}
        conn = self._connect()
        try:
            conn.send(request)
            # Bounded: a worker wedged but alive (stopped, stuck in the driver) must not hold the run forever.
            limit = self.settings.candidate_timeout_s + 3 * self.settings.reference_timeout_s + 600
            if not conn.poll(limit):
                raise InfrastructureError(f"{self.worker.describe()} gave no answer within {limit:.0f} s")
            reply = conn.recv()
        except (EOFError, OSError):
            again = "it is started again" if self.worker.proc else f"systemd starts {self.worker.unit} again"
            raise InfrastructureError(f"{self.worker.describe()} died mid-evaluation{self._exit()}; {again}") from None
        finally:
            conn.close()
        if "outcome" in reply:
            return reply["outcome"]
        if "cancelled" in reply:
            raise EvaluationCancelled(f"{self.worker.describe()}: {reply['cancelled']}")
        if "task_error" in reply:
            raise TaskError(*reply["task_error"])
        if "infrastructure_error" in reply:
            raise InfrastructureError(f"{self.worker.describe()}: {reply['infrastructure_error']}")
        raise RuntimeError(f"{self.worker.describe()} failed:\n{reply.get('bug', reply)}")

    def cancel_unmeasured(self) -> int:
        try:
            reply = call(self.worker.path, self.supervisor.key, {"op": "cancel_unmeasured", "client": self.client,
                                                                 "settings": self.fields})
        except AuthenticationError:
            return 0
        return (reply or {}).get("cancelled", 0)

    def prepare(self, task: Task) -> None:
        """Have the worker prepare the task's inputs now; what goes wrong shows again in the first evaluation."""
        conn = self._connect()
        try:
            conn.send({"op": "prepare", "settings": self.fields, "task": task_files(task)})
            conn.recv()
        except (EOFError, OSError):
            pass  # a worker lost now is the first evaluation's to report
        finally:
            conn.close()

    def _connect(self) -> Connection:
        """A connection to the worker; a worker being (re)started is waited for."""
        deadline = time.monotonic() + self.supervisor.timeout_s
        while True:
            try:
                self.supervisor.ensure(self.worker)
                return Client(str(self.worker.path), "AF_UNIX", authkey=self.supervisor.key)
            except AuthenticationError:
                raise InfrastructureError(f"{self.worker.describe()} refused our authkey: it belongs to another "
                                          "APPLIANCE_HOME") from None
            except (OSError, EOFError):  # not there yet, refused, or reset by a worker that is stopping
                if time.monotonic() > deadline:
                    self.supervisor.wait_ready(self.worker, deadline)  # raises, saying why
                time.sleep(0.1)

    def _exit(self) -> str:
        proc = self.worker.proc
        if proc is None:
            return ""
        try:
            return f" ({_exit_status(proc.wait(2))})"
        except subprocess.TimeoutExpired:
            return ""

    def close(self) -> None:
        """The run is over: the worker drops the inputs it kept for it."""
        try:
            call(self.worker.path, self.supervisor.key, {"op": "release", "settings": self.fields})
        except AuthenticationError:
            pass
        self.supervisor.closed(self)



def _exit_status(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"
