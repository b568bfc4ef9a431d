"""What every proposer receives and returns. A proposer never raises for bad model output: it returns a Proposal
with `failure` set, so the run records it and carries on."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar, Protocol


@dataclass
class Example:
    """A candidate shown to a proposer: its source and a short text of what the gate and the timer said about it."""

    source: str
    feedback: str = ""
    label: str = ""  # e.g. "parent", "best", "diverse: cuda backend"


@dataclass
class Measured:
    """A passing candidate of the run and its median times (ms): at the main shape, and at every other shape keyed
    by the shape of its first input (what forward sees as x.shape). The tuner's per-shape step reads these."""

    source: str
    main_ms: float | None
    by_shape: dict[tuple[int, ...], float] = field(default_factory=dict)


@dataclass
class PromptContext:
    task_name: str
    task_source: str
    parent: Example
    inspirations: list[Example] = field(default_factory=list)
    history: list[str] = field(default_factory=list)  # feedback lines of recent attempts (failures included)
    backends: list[str] = field(default_factory=lambda: ["triton"])
    device: str = "cuda"  # what the kernel will run on: "cuda (NVIDIA H200, sm_90)" or "cpu (Triton interpreter)"
    measured: list[Measured] = field(default_factory=list)  # the run's passing candidates and their times
    shapes: list[str] = field(default_factory=list)  # the shapes the gate checks, described (tasks.Shape.describe)
    # Passing candidates of earlier runs of the task, timed on the same GPU model and driver: the tuner's cache of
    # settings (a rerun starts from the best known instead of searching again).
    known: list[Measured] = field(default_factory=list)
    known_from: str = ""  # where they were timed, for the proposal's note: "runs 3, 5 on NVIDIA H200 (driver 570)"
    # The random choices of this request, drawn from the run's seed, generation and parent: a resumed run (a new
    # process, new proposers) makes the same choices an uninterrupted one would. None: the proposer's own.
    rng: random.Random | None = None


@dataclass
class Proposal:
    """One proposed candidate, or a recorded proposal failure (source None, failure says why; kind says what
    sort: "exhausted", nothing new left to propose, is no failure worth a row)."""

    source: str | None
    proposer: str
    failure: str | None = None
    kind: str = ""  # of a failure: exhausted | no_tunables | bad_tunables | model_output | endpoint | proposer_error
    mode: str = ""  # "diff" | "rewrite" | "tune"
    note: str = ""  # the proposer's own summary (LLM explanation, tuner parameters)
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    raw: str = ""  # the model's full reply, kept for debugging proposal failures


@dataclass(frozen=True)
class Traits:
    """What the loop needs to know of a proposer, instead of its name.
    - reads_profiles: its prompt carries Nsight Compute summaries (worth profiling new bests for it);
    - avoids_seen: it skips sources already evaluated itself (the loop hands it `seen`);
    - starts_on_pending_seed: it may build on the seed while the seed is still evaluated (settings of a kernel that
      built), and it needs the seed's verdict otherwise;
    - needs_no_screen: its candidates build whenever their parent did (no compile-only screen before a GPU)."""

    reads_profiles: bool = False
    avoids_seen: bool = False
    starts_on_pending_seed: bool = False
    needs_no_screen: bool = False


class Proposer(Protocol):
    """Every proposer: one signature. `seen` (source hashes already evaluated) matters only with avoids_seen."""

    name: ClassVar[str]
    traits: ClassVar[Traits]

    def propose(self, ctx: PromptContext, n: int, seen: set[str] | None = None) -> list[Proposal]: ...

    def accepts(self, parent_source: str) -> bool:
        """Whether it can build on this parent at all (the tuner needs declared TUNABLES). Asked only when a run
        has other proposers to give the slot to; a proposer asked anyway records why it could not propose."""
        ...
