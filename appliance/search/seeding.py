"""What a new optimize run starts from (its seed candidate, generation 0):

  --from FILE       the user's kernel (a ModelNew that passes the gate);
  --from compile    torch.compile's own kernels for the task, written out (proposers/compile_seed.py);
  neither           the bundled baseline for a task of the bundled suite, else torch.compile's kernels; and where
                    the tuner is in the run but cannot tune the baseline, torch.compile's kernels (they declare
                    their launch configs). No kernel at all: an LLM starts from the task's reference itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from appliance.config import Settings
from appliance.errors import ApplianceError
from appliance.proposers.mix import uses_llm
from appliance.tasks import Task, reference_seed

FROM_COMPILE = "compile"


@dataclass
class Seed:
    source: str
    path: str | None  # the file it came from, where there is one
    note: str
    proposer: str  # "seed" (a file) or "compile" (torch.compile's kernels)


def choose_seed(settings: Settings, task_path: Path, task: Task, start_from: Path | None, proposers: list[str],
                device: str, mode: str | None, gpus: str | None, unsafe: bool,
                say: Callable[[str], None] | None = None) -> Seed:
    """The seed of a new run of `task_path` with these proposers; `say` gets progress lines (None: quiet)."""
    from_compile = start_from is not None and str(start_from) == FROM_COMPILE
    if from_compile:
        start_from = None
    bundled = task_path.resolve().parent == settings.suite_dir.resolve()  # (a softmax.py of yours is not the suite's)
    seed_file = start_from or (baseline_of(settings, task_path) if bundled else None)
    if start_from is not None and not start_from.is_file():
        raise ApplianceError(f"--from {start_from}: no such file")
    if start_from is not None and proposers == ["tune"] and not tunable(start_from):
        raise ApplianceError(f"the tuner changes a kernel's declared TUNABLES, or the literal block sizes, "
                             f"num_warps and num_stages of its Triton launches, and {start_from} has none: "
                             "declare them (appliance/proposers/tune.py says how), leave out --from "
                             "to start from torch.compile's kernels (which declare their launch configs), "
                             "or use --proposer llm")
    usable = seed_file is not None and seed_file.is_file() and not from_compile
    if usable and ("tune" not in proposers or start_from is not None or declares_tunables(seed_file)):
        return Seed(seed_file.read_text(errors="replace"), str(seed_file.resolve()), "seed candidate", "seed")
    # No kernel the proposers can work on: torch.compile's own, written out (an LLM's parent too).
    captured = compile_seed(settings, task, device, mode, gpus, unsafe, say)
    if captured.source is not None:
        return Seed(captured.source, None, captured.note, "compile")
    if uses_llm(proposers):
        # The LLM starts from the reference itself (which fails the gate as a library fallback; its first
        # proposals are built on it and on that verdict).
        return Seed(reference_seed(task), None, "the task's reference, as ModelNew", "seed")
    raise ApplianceError(f"no seed candidate: {captured.failure}. Give --from FILE (a ModelNew that passes the "
                         "gate), or serve an LLM (APPLIANCE_LLM_URL, `appliance model serve`) and use --proposer "
                         "llm, which can start from the reference")


def compile_seed(settings: Settings, task: Task, device: str, mode: str | None, gpus: str | None, unsafe: bool,
                 say: Callable[[str], None] | None = None):
    """torch.compile's kernels for `task`, captured jailed on the device the run evaluates on."""
    from appliance.evaluation.pipeline import resolve_device
    from appliance.proposers.compile_seed import compile_seed as capture

    dev = resolve_device(device)
    gpu = int(gpus.split(",")[0]) if dev == "cuda" and gpus else (0 if dev == "cuda" else None)
    if say:
        say("no seed kernel: writing out torch.compile's own Triton kernels for every shape the gate checks "
            "(jailed) ...")
    seed = capture(task, settings.jail(gpu, unsafe), settings.jobs_dir, dev,
                   mode or ("full" if dev == "cuda" else "small"))
    if say:
        say(f"seed: {seed.note}" if seed.source else seed.failure)
    return seed


def baseline_of(settings: Settings, task_path: Path) -> Path:
    """The bundled baseline kernel of a bundled task (it may not exist)."""
    return settings.suite_dir.parent / "baselines" / task_path.name


def starts_from(baseline: Path) -> str:
    """What `optimize TASK` (no --from) starts from, for each proposer, for a bundled task with this baseline."""
    if not baseline.is_file():
        return "tune, llm: from torch.compile's kernels (the compile seed)"
    if declares_tunables(baseline):
        return "tune, llm: from the bundled baseline"
    return "tune: from torch.compile's kernels (the baseline declares no TUNABLES); llm: from the bundled baseline"


def tunable(path: Path) -> bool:
    """Whether the tuner can work on this kernel: declared TUNABLES, or launch parameters it can find."""
    from appliance.proposers.tune import tunable as has_launch_parameters

    try:
        return has_launch_parameters(path.read_text(errors="replace"))
    except OSError:
        return False


def declares_tunables(path: Path) -> bool:
    from appliance.proposers.tune import TuneError, read_tunables

    try:
        return bool(read_tunables(path.read_text(errors="replace")))
    except (TuneError, OSError):
        return False
