"""`appliance optimize`: propose -> evaluate -> select, until a budget runs out, with every step in the database.

Crash safety comes from the order of writes: a proposal is stored as a `queued` candidate before anything runs; its
evaluation and the candidate's `evaluated` status are written in one transaction. A run killed at any moment
resumes with `--resume`: finished evaluations stay, queued or in-flight candidates are evaluated (again).
Pause and stop are status changes in the database (from another process: `appliance pause RUN`), noticed between
evaluations.
"""

from __future__ import annotations

import math
import random
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from appliance.db import Store
from appliance.db.models import Candidate
from appliance.errors import EvaluationCancelled, InfrastructureError, TaskError
from appliance.evaluation.evaluator import Evaluator
from appliance.evaluation.pipeline import PROFILE_MIN_GAIN, Outcome
from appliance.metrics import Metrics
from appliance.proposers import mix
from appliance.proposers.base import Example, Measured, PromptContext, Proposal
from appliance.proposers.mix import Bandit
from appliance.proposers.edits import source_hash
from appliance.search.database import Entry, SearchDatabase, feedback
from appliance.tasks import Task


BARREN_GENERATIONS = 3  # generations in a row without a new candidate to evaluate end the run
BUDGETS = ("max_candidates", "max_gpu_seconds", "max_wall_s", "max_tokens")


# A run's first candidate: a given file ("seed") or torch.compile's kernels written out ("compile").
SEED_PROPOSERS = ("seed", "compile")


@dataclass
class OptimizeConfig:
    proposer: str = "tune"  # tune | llm
    max_candidates: int = 20  # evaluated candidates (the seed included)
    max_gpu_seconds: float | None = None  # wall seconds of evaluation processes on a GPU
    max_wall_s: float | None = None  # of the run, summed over every session that worked on it
    max_tokens: int | None = None  # LLM prompt + completion tokens
    batch: int = 2  # proposals per generation
    islands: int = 2
    migrate_every: int = 3  # generations
    exploit: float = 0.7  # probability that the parent is the island's best rather than a random elite
    seed: int = 0
    device: str = "auto"
    mode: str | None = None
    timing_budget_s: float = 1.0
    workers: int = 0  # evaluations in flight per device (0: pipeline.default_slots); measuring takes turns
    profile: bool = True  # Nsight Compute summary for new bests (GPU only), when the proposer reads it
    # A run whose best passing candidate reaches this fraction of the roofline at the main shape (the GPU's measured
    # bandwidth and FLOP ceilings for the task's bytes and FLOPs) finishes: what is left to find is within the
    # noise of the ceilings themselves. None or 0: never. GPU only (the CPU measures no roofline).
    stop_at_roofline: float | None = 0.95

    @classmethod
    def from_dict(cls, data: dict) -> OptimizeConfig:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class Summary:
    run_id: int
    status: str
    evaluated: int
    passed: int
    proposal_failures: int
    duplicates: int
    best: dict | None
    seed: dict | None
    usage: dict = field(default_factory=dict)
    proposers: list[dict] = field(default_factory=list)  # each proposer's yield (proposers/mix.py)
    finished_because: str = ""  # when a run ends before its budget: near the roofline


class Optimizer:
    def __init__(self, store: Store, run_id: int, task: Task, pipelines: list[Evaluator], proposers: list,
                 config: OptimizeConfig, work_dir: Path, log: Callable[[str], None] = lambda _: None,
                 metrics: Metrics | None = None, should_stop: Callable[[], bool] = lambda: False,
                 screens: list | None = None, status: Callable[[str], None] | None = None):
        self.store, self.run_id, self.task, self.pipelines = store, run_id, task, pipelines
        self.status = status  # a live line for a terminal: evaluated, in flight, best so far, budget left
        # Compile-only checks before a candidate takes a GPU slot (evaluation/compile_screen.py; CPU-only nodes).
        self.screens = list(screens or [])
        self.config, self.work_dir, self.log = config, work_dir, log
        # Several proposers share a run: the bandit gives each slot of a generation to one (proposers/mix.py).
        self.proposers = {p.name: p for p in proposers}
        self.bandit = Bandit(list(self.proposers))
        # No proposer: a hand submission evaluated by `appliance submit` (its new bests are profiled, as an LLM's).
        reads_profiles = not proposers or any(p.traits.reads_profiles for p in proposers)
        self.metrics, self.should_stop = metrics, should_stop
        self.failure_streak = 0  # infrastructure failures in a row
        self.time_is_up = False  # the wall-clock or GPU-second budget is spent
        for p in pipelines:
            p.profile_if = ProfileNewBests(self, enabled=reads_profiles)
        if metrics:
            for p in pipelines:
                metrics.worker_up(p.gpu)
        run = store.get_run(run_id)
        self.state = dict(run.state or {})
        self.state.setdefault("generation", 0)
        self.state.setdefault("migrants", {})
        self.state.setdefault("elapsed_s", 0.0)
        self.state.setdefault("gpu_seconds", 0.0)
        self.state.setdefault("duplicates", 0)
        # One stream of choices per generation: a resumed run makes the same choices it would have made.
        self.rng = random.Random(config.seed)
        self._known: tuple | None = None  # (environment, measured, where) of earlier runs: _known_elsewhere
        work_dir.mkdir(parents=True, exist_ok=True)

    # --- the loop ---

    def run(self) -> Summary:
        requeued = self.store.requeue_unfinished(self.run_id)
        if requeued:
            self.log(f"re-queued {requeued} candidate(s) left unfinished by an earlier session")
        self.store.update_run(self.run_id, status="running")
        self.state.pop("finished_because", None)  # (a resumed run decides again, under its config of now)
        try:
            status = self._loop()
        finally:
            for pipeline in self.pipelines:
                pipeline.close()
            for screen in self.screens:
                getattr(screen, "close", lambda: None)()
        if status == "finished":  # nothing stays queued forever: each left is marked, with why
            self.store.close_queue(self.run_id, "not evaluated: the run finished first (its budget was spent, or "
                                                "it stopped finding new candidates); --resume with a larger budget "
                                                "evaluates it")
        self.store.update_run(self.run_id, status=status, state=self.state)
        return self.summary()

    def _loop(self) -> str:
        """Keep every evaluation slot busy: start queued candidates as slots free up, propose when nothing is
        queued, record each result as it comes."""
        started = time.monotonic()
        slots = [p for p in self.pipelines for _ in range(p.slots)]
        in_flight: dict[Future, tuple[Candidate, Evaluator]] = {}
        screen_slots = [s for s in self.screens for _ in range(s.slots)]
        screening: dict[Future, tuple[Candidate, object]] = {}
        cleared: set[int] = set()  # candidates the screens let through
        # Screens on their own threads, never waited for at the end: a check's verdict is disposable (the candidate
        # stays queued), and a screen that hangs must not hold up a finish, a pause or a stop.
        screen_pool = ThreadPoolExecutor(max(1, len(screen_slots)))
        proposed_after = -1  # results recorded when we last proposed: propose again only after a new one
        recorded = 0
        status = "running"
        with ThreadPoolExecutor(len(slots) + len(self.pipelines)) as pool:
            # Every worker prepares the task's inputs and baselines now, while the first candidates are evaluated
            # on another: a GPU that waited for its first candidate to start preparing joined a run ~1 min late.
            for pipeline in self.pipelines:
                pool.submit(self._prepare, pipeline)
            try:
                while True:
                    # One snapshot of the run a tick: its status and budgets (which the TUI may change) and rows.
                    run, rows = self.store.get_run(self.run_id), self.store.run_candidates(self.run_id)
                    status = (run.status if run.status in ("paused", "stopped") else None) or \
                        self._budget_status(run, rows)
                    if status == "running" and self.should_stop():
                        status = "queued"  # the controller is shutting down: the run goes back to its queue
                    if status != "running":
                        break
                    queued = [c for c, _ in rows if c.status == "queued"]
                    if self.metrics:
                        self.metrics.queue_depth.set(len(queued))
                    room = self._room(rows) - len(in_flight)
                    ready = self._screen_queued(queued, screening, cleared, screen_slots, screen_pool, room)
                    free = _free_slots(slots, [p for _, p in in_flight.values()])
                    starting = list(zip(ready[:max(room, 0)], free))
                    for candidate, pipeline in starting:
                        self.store.set_candidate_status(candidate.id, "evaluating")
                        in_flight[pool.submit(self._evaluate_one, candidate, pipeline)] = (candidate, pipeline)
                    # Slots still empty: a generation fills them all (not just `batch` of them), else a run with
                    # many slots ramps up one slot per verdict and most of its slots idle through a short run.
                    # Candidates still to be screened will take slots too: no proposals for those.
                    empty = min(len(free), max(room, 0)) - len(starting) - (len(queued) - len(ready))
                    size = max(self.config.batch, empty)
                    if not in_flight and not screening:
                        if not self._propose_generation(size):
                            self.state["barren"] = self.state.get("barren", 0) + 1
                            if self.state["barren"] >= BARREN_GENERATIONS:
                                self.log(f"{BARREN_GENERATIONS} generations in a row gave nothing new to evaluate: "
                                         "finishing")
                                status = "finished"
                                break
                    else:
                        if empty > 0 and proposed_after < recorded and self._has_parent():
                            proposed_after = recorded
                            self._propose_generation(size)  # fills the spare slots while the others evaluate
                        done, _ = wait([*in_flight, *screening], timeout=1.0, return_when=FIRST_COMPLETED)
                        for future in done:
                            if future in screening:
                                candidate, _ = screening.pop(future)
                                if (rejected := future.result()) is None:
                                    cleared.add(candidate.id)
                                    continue
                                self._record(candidate, rejected, screened=True)
                            else:
                                candidate, _ = in_flight.pop(future)
                                self._record(candidate, future.result())
                            recorded += 1
                    self.state["elapsed_s"] += time.monotonic() - started
                    started = time.monotonic()
                    self.state["heartbeat"] = time.time()  # a controller on another host tells a live run by it
                    self.store.update_run(self.run_id, state=self.state)
                    if self.status:  # (a read of the run: only for someone watching)
                        self.status(self._status_line(recorded, len(in_flight) + len(screening)))
            finally:
                # What was started finishes and is recorded (a pause or a shutdown loses no evaluation in flight).
                # When time is up, or the run is paused or stopped, only what measures already: evaluations still
                # waiting for the device are called off, their candidates queued again (--resume evaluates them).
                if in_flight and (self.time_is_up or status in ("paused", "stopped", "queued")):
                    if called_off := sum(p.cancel_unmeasured() for p in self.pipelines):
                        self.log(f"{called_off} evaluation(s) not measuring yet called off; their candidates are "
                                 "queued again")
                failure = None
                for future in as_completed(list(in_flight)):  # each stored as it ends, not behind a slower one
                    candidate, _ = in_flight.pop(future)
                    try:
                        self._record(candidate, future.result())
                    except Exception as e:  # noqa: BLE001 - raised below, once the others are recorded
                        failure = failure or e
                self.state["elapsed_s"] += time.monotonic() - started
                screen_pool.shutdown(wait=False, cancel_futures=True)
                if failure:
                    raise failure
        return status

    def _screen_queued(self, queued: list[Candidate], screening: dict, cleared: set[int], screen_slots: list,
                       pool: ThreadPoolExecutor, room: int) -> list[Candidate]:
        """The queued candidates that may go to a GPU now; those that need a compile-only check first are sent to a
        free screen, as many as the candidate budget has room for (a rejection counts as an evaluation). The tuner's
        need none: they are settings of a kernel that built."""
        if not screen_slots:
            return queued
        free = _free_slots(screen_slots, [s for _, s in screening.values()])
        waiting = {c.id for c, _ in screening.values()}
        unscreened = {p.name for p in self.proposers.values() if p.traits.needs_no_screen}
        ready = [c for c in queued if c.id in cleared or c.proposer in unscreened]
        for c in queued:
            if c.id in cleared or c.proposer in unscreened or c.id in waiting:
                continue
            if not free or len(ready) + len(screening) >= room:
                break
            screen = free.pop(0)
            screening[pool.submit(self._screen_one, c, screen)] = (c, screen)
        return ready

    def _screen_one(self, candidate: Candidate, screen) -> Outcome | None:
        try:
            rejected = screen.screen(self.task, self._candidate_file(candidate))
        except Exception as exc:  # noqa: BLE001 - a screen that breaks costs only the screening: the GPU decides
            self.log(f"candidate c{candidate.id}: the compile-only check failed ({type(exc).__name__}: {exc}); "
                     "evaluating it on the GPU all the same")
            return None
        if rejected is not None:
            rejected = replace(rejected, mode=self.config.mode or rejected.mode)
        return rejected

    def _prepare(self, pipeline: Evaluator) -> None:
        try:
            pipeline.prepare(self.task)
        except (TaskError, InfrastructureError) as e:
            where = "the CPU" if pipeline.gpu is None else f"GPU {pipeline.gpu}"
            self.log(f"preparing the task on {where} failed (the first evaluation there says why): {e}")

    def _room(self, rows: list) -> int:
        """Evaluations the candidate budget still allows."""
        return self.config.max_candidates - sum(1 for _, e in rows if e is not None)

    def _has_parent(self) -> bool:
        """Whether proposals can be made while evaluations are in flight: something passed, or the tuner may build on
        the seed still being evaluated (_starting_point)."""
        db = self._database()
        return db.best() is not None or any(p.traits.starts_on_pending_seed and self._starting_point(db, p) is not None
                                            for p in self.proposers.values())

    def _status_line(self, recorded: int, in_flight: int) -> str:
        c = self.config
        best = summarize(self.store, self.run_id, self.state).best
        shown = "-" if not best else (f"c{best['candidate_id']} {best['speedup_vs_eager']:.3g}x vs eager"
                                      if best.get("device") == "cuda" and best.get("speedup_vs_eager")
                                      else f"c{best['candidate_id']} (passes; CPU: no speedup quoted)")
        left = [f"{c.max_candidates - recorded} of {c.max_candidates} evaluations"]
        if c.max_wall_s is not None:
            left.append(f"{max(0.0, c.max_wall_s - self.state['elapsed_s']):.0f} s")
        if c.max_gpu_seconds is not None:
            left.append(f"{max(0.0, c.max_gpu_seconds - self.state['gpu_seconds']):.0f} GPU-s")
        return (f"run {self.run_id}: {recorded} evaluated in this session, {in_flight} in flight, best {shown}; "
                f"left: {', '.join(left)}")

    def _budget_status(self, run, rows: list) -> str:
        # Budgets are read from the database each time: the TUI (or anyone) may change them while the run goes on.
        stored = OptimizeConfig.from_dict(run.config or {})
        c = self.config
        for name in BUDGETS:
            setattr(c, name, getattr(stored, name))
        evaluated = sum(1 for cand, e in rows if e is not None)
        tokens = sum(cand.tokens_in + cand.tokens_out for cand, _ in rows)
        if evaluated >= c.max_candidates:
            return "finished"
        if (c.max_gpu_seconds is not None and self.state["gpu_seconds"] >= c.max_gpu_seconds) or \
                (c.max_wall_s is not None and self.state["elapsed_s"] >= c.max_wall_s):
            self.time_is_up = True
            return "finished"
        if c.max_tokens is not None and tokens >= c.max_tokens:
            return "finished"
        if c.stop_at_roofline and (near := _near_the_roofline(rows, c.stop_at_roofline)):
            if not self.state.get("finished_because"):
                self.log(near)
            self.state["finished_because"] = near
            return "finished"
        return "running"

    # --- evaluation ---

    def evaluate(self, candidates: list[Candidate]) -> None:
        """Evaluate these candidates now, one at a time (a hand submission), and record them."""
        try:
            for c in candidates:
                self.store.set_candidate_status(c.id, "evaluating")
                self._record(c, self._evaluate_one(c, self.pipelines[0]))
        finally:
            for pipeline in self.pipelines:
                pipeline.close()

    def _candidate_file(self, candidate: Candidate) -> Path:
        path = self.work_dir / f"candidate-{candidate.id}.py"
        path.write_text(candidate.source)
        return path

    def _evaluate_one(self, candidate: Candidate, pipeline: Evaluator) -> Outcome | InfrastructureError:
        path = self._candidate_file(candidate)
        try:
            return pipeline.evaluate(self.task, path)
        except (InfrastructureError, EvaluationCancelled) as e:  # not the candidate's doing: back to the queue
            return e

    def _infrastructure_failure(self, candidate: Candidate, error: InfrastructureError) -> Outcome | None:
        """A worker or host failed, not the candidate: queued again once, then recorded as an infrastructure
        failure while the run goes on. Failures on every slot in a row mean the host itself is broken: the run stops
        with the error (the candidate stays queued for --resume)."""
        self.failure_streak += 1
        if self.failure_streak >= 2 * sum(p.slots for p in self.pipelines):
            self.store.set_candidate_status(candidate.id, "queued")
            raise error
        retried = self.state.setdefault("requeued_after_infrastructure_failure", [])
        if candidate.id not in retried:
            retried.append(candidate.id)
            self.store.set_candidate_status(candidate.id, "queued")
            self.log(f"candidate c{candidate.id}: the worker failed ({error}); queued again")
            return None
        self.log(f"candidate c{candidate.id}: the worker failed again ({error}); recorded as an infrastructure failure")
        device = "cpu" if self.pipelines[0].gpu is None else "cuda"
        return Outcome(verdict="infrastructure_failure", stage="load", reason=f"not the candidate's fault: {error}",
                       jailed=True, device=device, mode=self._mode(), details={"infrastructure_error": str(error)})

    def _mode(self) -> str:
        """The size mode the run's evaluations use."""
        return self.config.mode or ("full" if self.pipelines[0].gpu is not None else "small")

    def _record(self, candidate: Candidate, outcome: Outcome | InfrastructureError | EvaluationCancelled,
                screened: bool = False) -> None:
        if isinstance(outcome, EvaluationCancelled):
            self.store.set_candidate_status(candidate.id, "queued")
            return
        if isinstance(outcome, InfrastructureError):
            outcome = self._infrastructure_failure(candidate, outcome)
            if outcome is None:
                return
        elif not screened:  # a screen's verdict says nothing of whether the GPU workers work
            self.failure_streak = 0
        o = outcome
        if self.metrics:
            self.metrics.evaluation(o, candidate.proposer)
        if o.device == "cuda":
            # Charged for the time it had the GPU to itself: overlapping evaluations are not counted twice.
            turns = o.details.get("device_turns") or {}
            self.state["gpu_seconds"] += turns.get("held_s") or 0.0
            self.state["energy_j"] = self.state.get("energy_j", 0.0) + (turns.get("joules") or 0.0)
        self.store.add_outcome(candidate.id, self.run_id, o)
        if self.metrics and o.passed:
            best = summarize(self.store, self.run_id, self.state).best or {}
            self.metrics.best(self.run_id, best.get("speedup_vs_eager"), best.get("speedup_vs_compile"))
        speed = ("" if not o.speedup_vs_eager else f", {o.speedup_vs_eager:.3g}x vs eager" if o.device == "cuda"
                 else f", {o.timings[0]['median_ms']:.3g} ms in the interpreter (CPU: no GPU speed)"
                 if o.timings else "")
        self.log(f"candidate c{candidate.id} ({candidate.proposer}{': ' + candidate.note if candidate.note else ''})"
                 f": {o.verdict}{speed}")

    # --- proposals ---

    def _propose_generation(self, size: int = 0) -> bool:
        """Propose one generation of `size` (at least config.batch) proposals; False when it queued nothing new to
        evaluate (only failures or duplicates)."""
        self.rng = random.Random(f"{self.config.seed}-{self.state['generation']}")
        db = self._database()
        generation = self.state["generation"]
        seen = db.seen_hashes()
        timings: dict[int, list] = {}  # evaluation id -> its Timing rows
        for t in self.store.run_timings(self.run_id):
            timings.setdefault(t.evaluation_id, []).append(t)
        measured = self._measured(db, timings)
        known = self._known_elsewhere(db)
        stats = mix.yields(self.store.run_candidates(self.run_id), list(self.proposers))
        empty_answers = self.state.setdefault("empty_answers", {})  # proposer -> answers that gave nothing new
        for name, count in empty_answers.items():
            if name in stats:
                stats[name].empty = count
        virtual: dict[str, int] = {}  # this generation's choices so far
        queued_any, slots, short = False, max(size, self.config.batch), set()
        # Slots a proposer left empty (a tuner with nothing new to offer on its parent) go to the others, once.
        for attempt in range(2):
            groups = self._choose_slots(db, generation, slots, stats, virtual, exclude=short)
            if groups is None and attempt == 0:
                self.log("no passing candidate to build on: the seed candidate failed the gate")
                return False
            if groups is None:
                break
            answers = self._answers(db, groups, generation, measured, timings, known, seen)
            slots = 0
            for (name, parent, islands), proposals in zip(groups, answers):
                stored = [self._store_proposal(p, parent, island, generation, seen)
                          for island, p in zip(islands, proposals)]  # (never more than asked: the budget sized it)
                queued_any = queued_any or any(stored)
                failed = sum(p.source is None and p.kind != "exhausted" for p in proposals[:len(islands)])
                if empty := len(islands) - sum(stored) - failed:  # exhausted, duplicates, or fewer than asked
                    empty_answers[name] = empty_answers.get(name, 0) + empty
                    stats[name].empty = empty_answers[name]
                    slots += empty
                    short.add(name)
            if not slots or set(self.proposers) <= short:
                break
        self.state["generation"] = generation + 1
        if queued_any:
            self.state["barren"] = 0
        if (generation + 1) % self.config.migrate_every == 0:
            self.state["migrants"] = self._database().migrate(self.state["migrants"])
        return queued_any

    def _choose_slots(self, db: SearchDatabase, generation: int, slots: int, stats: dict, virtual: dict,
                      exclude: set[str]) -> list[tuple[str, Entry, list[int]]] | None:
        """Slot by slot, in order (so a seed gives the same choices): a proposer (the bandit's choice), then a parent
        for it. One request per (proposer, parent), for as many proposals as slots chose them, so that a tuner's
        proposals for one parent differ from each other. None when no proposer has a parent."""
        groups: dict[tuple[str, int], tuple[str, Entry, list[int]]] = {}
        for slot in range(slots):
            island = (generation * self.config.batch + slot) % self.config.islands
            choice = self._choose(db, island, stats, virtual, exclude)
            if choice is None:
                return None
            name, parent = choice
            virtual[name] = virtual.get(name, 0) + 1
            groups.setdefault((name, parent.candidate.id), (name, parent, []))[2].append(island)
        return list(groups.values())

    def _answers(self, db: SearchDatabase, groups: list, generation: int, measured: list[Measured],
                 timings: dict[int, list], known: tuple, seen: set[str]) -> list[list[Proposal]]:
        """Each group's proposals, in the order of `groups`."""
        asks = [(name, len(islands), replace(
                    self._context(db, parent, measured, timings), known=known[0], known_from=known[1],
                    rng=random.Random(f"{self.config.seed}-{generation}-{name}-{parent.candidate.id}")))
                for name, parent, islands in groups]
        answers: dict[int, list[Proposal]] = {}
        # Proposers that avoid seen sources (the tuner), in this process and fast: one parent after another, each
        # told what the others proposed, so that two parents of one family do not both propose the same settings.
        taken = set(seen)
        for i, (name, n, ctx) in enumerate(asks):
            if self.proposers[name].traits.avoids_seen:
                answers[i] = self._ask(name, ctx, n, taken)
                taken |= {source_hash(p.source) for p in answers[i] if p.source}
        # The others (an LLM answers several prompts in parallel): every request in flight at once.
        rest = [i for i in range(len(asks)) if i not in answers]
        if rest:
            def ask(i: int) -> list[Proposal]:
                name, n, ctx = asks[i]
                return self._ask(name, ctx, n, set(seen))

            with ThreadPoolExecutor(len(rest)) as pool:
                answers.update(zip(rest, pool.map(ask, rest)))
        return [answers[i] for i in range(len(asks))]

    def _choose(self, db: SearchDatabase, island: int, stats: dict, virtual: dict,
                exclude: set[str] = frozenset()) -> tuple[str, Entry] | None:
        """A proposer and a parent for one slot. The bandit picks among the proposers that have a parent they can
        work on (the tuner needs declared TUNABLES), leaving out those in `exclude` while others remain; when none
        can, the bandit's pick is asked anyway and records why it could not propose."""
        allowed, fallback = [n for n in self.proposers if n not in exclude] or list(self.proposers), None
        while allowed:
            name = self.bandit.choose(stats, self.rng, allowed, virtual)
            proposer = self.proposers[name]
            parent = db.select_parent(island, self.config.exploit) or self._starting_point(db, proposer)
            if parent is None:
                allowed.remove(name)
                continue
            if len(self.proposers) == 1 or _accepts(proposer, parent.candidate.source):
                return name, parent
            fallback = fallback or (name, parent)
            allowed.remove(name)
        return fallback

    def _starting_point(self, db: SearchDatabase, proposer) -> Entry | None:
        """The parent before anything passes.
        - An LLM builds on the seed as it is, with its verdict as feedback (e.g. the task's reference, rejected as a
          library fallback, when the run has no kernel to start from).
        - The tuner builds on the seed while the seed's own evaluation is still under way (first generation only):
          settings of the kernel the run starts from, which almost always passes. The other slots then fill at
          once instead of idling through the seed's whole evaluation (on the H200 at full size, 72 s of a 288 s
          run gave one verdict). A seed that fails leaves these to be evaluated: the run goes on from those that
          pass, and ends when none does."""
        seeds = [e for e in db.entries if e.candidate.proposer in SEED_PROPOSERS]
        if not proposer.traits.starts_on_pending_seed:
            evaluated = [e for e in seeds if e.evaluation is not None]
            return evaluated[0] if evaluated else None
        if self.state["generation"] == 0:
            # Evaluating, not queued: a seed still waiting for a compile-only screen may not build for the GPU, and
            # the tuner's settings of it are not screened themselves.
            pending = [e for e in seeds if e.evaluation is None and e.candidate.status == "evaluating"]
            return pending[0] if pending else None
        return None

    def _ask(self, name: str, ctx: PromptContext, n: int, seen: set[str]) -> list[Proposal]:
        proposer = self.proposers[name]
        try:  # (a proposer that does not avoid seen sources itself has its duplicates dropped here)
            return proposer.propose(ctx, n, seen=seen if proposer.traits.avoids_seen else None)
        except Exception as exc:  # noqa: BLE001 - a proposer bug costs a recorded failure, never the run
            return [Proposal(source=None, proposer=name, kind="proposer_error",
                             failure=f"proposer_error: {type(exc).__name__}: {exc}"[:500])]

    def _store_proposal(self, p: Proposal, parent: Entry, island: int, generation: int, seen: set[str]) -> bool:
        """Store a proposal: queued for evaluation (True), or a recorded failure / skipped duplicate (False)."""
        common = dict(parent_id=parent.candidate.id, proposer=p.proposer, island=island, generation=generation,
                      note=p.note, tokens_in=p.tokens_in, tokens_out=p.tokens_out)
        if self.metrics:
            self.metrics.proposal(p, failed=p.source is None and p.kind != "exhausted")
        if p.source is None:
            if p.kind == "exhausted":
                return False  # nothing new is not a failure worth a row
            self.store.add_candidate(self.run_id, self._task_id(), "", status="proposal_failed",
                                     failure=p.failure, **common)
            self.log(f"proposal failed: {(p.failure or '')[:200]}")
            return False
        digest = source_hash(p.source)
        if digest in seen:
            self.state["duplicates"] += 1
            return False
        seen.add(digest)
        self.store.add_candidate(self.run_id, self._task_id(), p.source, status="queued", **common)
        return True

    def _context(self, db: SearchDatabase, parent: Entry, measured: list[Measured],
                 timings: dict[int, list]) -> PromptContext:
        def told(e: Entry) -> str:
            return feedback(e, timings.get(e.evaluation.id) if e.evaluation else None)

        inspirations = [Example(e.candidate.source, told(e), label) for label, e in db.inspirations(parent)]
        device = "cuda" if self.pipelines[0].gpu is not None else "cpu (Triton interpreter)"
        return PromptContext(
            task_name=self.task.name, task_source=self.task.path.read_text(),
            parent=Example(parent.candidate.source, told(parent), "parent"), inspirations=inspirations,
            history=[feedback(e) for e in db.failures()], backends=list(self.task.manifest.backends), device=device,
            measured=measured, shapes=[sh.describe() for sh in self.task.shapes(self._mode())])

    def _known_elsewhere(self, db: SearchDatabase) -> tuple[list[Measured], str]:
        """The passing candidates of this task's earlier runs, timed on what this run's evaluations run on (device,
        GPU model, driver, size mode), and a description of where: read once the run's first verdict says what that
        is, then kept (earlier runs do not change)."""
        # The latest passing evaluation says where this run measures (a rejected one may not have got that far, and
        # an environment flipping between the two would re-read every earlier run at every generation).
        latest = next((e.evaluation for e in reversed(db.entries)
                       if e.evaluation is not None and e.evaluation.verdict == "pass"), None)
        if latest is None:
            return [], ""
        where = _environment(latest)
        if self._known is not None and self._known[0] == where:
            return self._known[1], self._known[2]
        found, runs = [], []
        for run in self.store.runs_of_task(self._task_id()):
            if run.id == self.run_id:
                continue
            other = SearchDatabase(self.store.run_candidates(run.id), 1, {}, self.rng)
            timings: dict[int, list] = {}
            for t in self.store.run_timings(run.id):
                timings.setdefault(t.evaluation_id, []).append(t)
            mine = [m for m, e in zip(self._measured(other, timings), other.passed()) if _environment(e.evaluation)
                    == where]
            if mine:
                found += mine
                runs.append(str(run.id))
        gpu, driver = where[1] or where[0], f" (driver {where[2]})" if where[2] else ""
        described = f"run{'s' if len(runs) > 1 else ''} {', '.join(runs)} on {gpu}{driver}" if runs else ""
        self._known = (where, found, described)
        return found, described

    def _measured(self, db: SearchDatabase, timings: dict[int, list]) -> list[Measured]:
        """Each passing candidate's times per shape (for per-shape tuning), the shapes named by their first input."""
        measured = []
        for entry in db.passed():
            by_name = {t.shape: t.median_ms for t in timings.get(entry.evaluation.id, [])
                       if t.implementation == "candidate" and t.median_ms}
            by_shape: dict[tuple[int, ...], float] = {}
            shapes = [s for s in (entry.evaluation.details or {}).get("shapes", []) if s.get("input_shapes")]
            main_key = tuple(shapes[0]["input_shapes"][0]) if shapes else None
            for shape in shapes:
                key = tuple(shape["input_shapes"][0])
                # The constants are tuned for the main shape; a shape that looks like it is the main shape's too.
                if key != main_key and shape["name"] in by_name:
                    by_shape[key] = by_shape.get(key, 0.0) + by_name[shape["name"]]  # shapes alike share a key
            measured.append(Measured(entry.candidate.source, by_name.get("main"), by_shape))
        return measured

    def _database(self) -> SearchDatabase:
        return SearchDatabase(self.store.run_candidates(self.run_id), self.config.islands, self.state["migrants"],
                              self.rng)

    def _task_id(self) -> int:
        return self.store.get_run(self.run_id).task_id

    # --- results ---

    def summary(self) -> Summary:
        return summarize(self.store, self.run_id, self.state)


def summarize(store: Store, run_id: int, state: dict | None = None) -> Summary:
    run = store.get_run(run_id)
    state = state if state is not None else dict(run.state or {})
    rows = store.run_candidates(run_id)
    entries = [Entry(c, e) for c, e in rows]
    passed = [e for e in entries if e.passed]
    best = max(passed, key=lambda e: e.score, default=None)
    seed = entries[0] if entries else None

    def describe(entry: Entry | None) -> dict | None:
        if entry is None or entry.evaluation is None:
            return None
        e = entry.evaluation
        return {"candidate_id": entry.candidate.id, "proposer": entry.candidate.proposer, "verdict": e.verdict,
                "speedup_vs_eager": e.speedup_vs_eager, "speedup_vs_compile": e.speedup_vs_compile,
                "evaluation_id": e.id, "note": entry.candidate.note, "device": e.device}

    tokens = sum(c.tokens_in + c.tokens_out for c, _ in rows)
    device_seconds = "GPU-s" if any(e is not None and e.device == "cuda" for _, e in rows) else "CPU-s"
    return Summary(run_id=run_id, status=run.status, evaluated=sum(1 for _, e in rows if e is not None),
                   passed=len(passed), proposal_failures=sum(1 for c, _ in rows if c.status == "proposal_failed"),
                   duplicates=int(state.get("duplicates", 0)), best=describe(best), seed=describe(seed),
                   usage={"gpu_seconds": round(state.get("gpu_seconds", 0.0), 1),
                          "wall_seconds": round(state.get("elapsed_s", 0.0), 1), "llm_tokens": tokens,
                          "generations": state.get("generation", 0)},
                   finished_because=state.get("finished_because", ""),
                   proposers=[y.as_dict() | {"line": mix.describe(y, device_seconds)}
                              for y in mix.run_yields(run.config, rows)])


def config_dict(config: OptimizeConfig) -> dict:
    return asdict(config)


class ProfileNewBests:
    """Which passing candidates get an Nsight Compute profile (Evaluator.profile_if): those that beat the run's best
    speedup by PROFILE_MIN_GAIN, and none when the proposer does not read profiles (`reads_profiles`: the tuner).
    A profile holds the device exclusively ~10 s on the H200: on the H200 a tuner run that profiled its new bests spent
    about half its device time on profiles no one read. Remote workers (Ray) cannot read the database: they get
    `threshold()` with each evaluation instead (infinite when disabled)."""

    def __init__(self, optimizer: Optimizer, enabled: bool = True):
        self.optimizer, self.enabled = optimizer, enabled

    def threshold(self) -> float:
        if not self.enabled:
            return math.inf
        o = self.optimizer
        best = summarize(o.store, o.run_id, o.state).best
        return PROFILE_MIN_GAIN * ((best or {}).get("speedup_vs_eager") or 0.0)

    def __call__(self, speedup: float | None) -> bool:
        return bool(speedup) and speedup > self.threshold()


def _near_the_roofline(rows: list, threshold: float) -> str | None:
    """Why the run can stop: a passing candidate at `threshold` of the roofline or more; None otherwise."""
    for candidate, e in rows:
        fraction = ((e.details or {}).get("evidence") or {}).get("roofline_fraction") if e is not None else None
        if e is not None and e.verdict == "pass" and isinstance(fraction, (int, float)) and fraction >= threshold:
            return (f"candidate c{candidate.id} runs at {fraction:.0%} of the roofline at the main shape (the run "
                    f"stops at {threshold:.0%}: --stop-at-roofline; resume with --stop-at-roofline 0 to search on): "
                    "finishing")
    return None


def _environment(evaluation) -> tuple:
    """What a time was measured on: timings compare only within the same device, GPU model, driver and size mode."""
    env = evaluation.environment or {}
    return evaluation.device, env.get("gpu"), env.get("driver"), evaluation.mode


def _accepts(proposer, source: str) -> bool:
    try:
        return proposer.accepts(source)
    except Exception:  # noqa: BLE001 - a proposer that cannot judge a parent is not given it (the others are)
        return False


def _free_slots(slots: list[Evaluator], busy: list[Evaluator]) -> list[Evaluator]:
    """One pipeline per free slot, interleaved so that the least busy device gets the next evaluation."""
    order = []
    for p in dict.fromkeys(slots):  # each pipeline once, in order
        used = busy.count(p)
        order += [(used + j, slots.index(p), p) for j in range(slots.count(p) - used)]
    return [p for *_, p in sorted(order, key=lambda e: e[:2])]
