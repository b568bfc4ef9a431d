"""Several proposers in one run, and the bandit that picks which one fills the next slot.

A run names its proposers as a comma-separated list (`--proposer tune,llm:qwen,llm:devstral`):
- `tune`: the parameter tuner (appliance/proposers/tune.py);
- `llm`: the LLM endpoint of the environment (APPLIANCE_LLM_URL, APPLIANCE_LLM_MODEL);
- `llm:PROFILE`: the model a profile serves (models/PROFILE.toml: its URL and served name), so a fast model for
  breadth and a strong one for depth can work in one run.

Yield. Each proposer's record is read from the run's rows, so it survives a restart and needs no state of its own:
- gain: for each candidate that passed and beat its parent, log2 of its speedup over the parent (a 2x step counts
  1, two 1.41x steps count 1 together);
- cost: the GPU-seconds its evaluations held the device (CPU seconds of evaluation on a machine without a GPU),
  plus SECONDS_PER_TOKEN for every prompt and completion token (the LLM's own GPU is busy for them too).

The bandit. Like ShinkaEvolve's choice among LLMs, it is an upper-confidence rule, here on gain per second of cost:
an arm's index is its rate (gain / cost, with one pseudo-pull of prior: PRIOR_GAIN at the run's mean evaluation cost)
plus an exploration bonus sqrt(2 ln N / n) scaled by the best arm's rate, so an arm never tried is tried early and
an arm that found nothing for a while is still tried now and then. Choices within one generation count as pulls already made ("virtual pulls"), so a generation's slots
spread over arms whose indices are close instead of all going to the top one. Ties break by the generation's rng,
so a resumed run makes the same choices.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from appliance.errors import ApplianceError

# Prompt + completion tokens per GPU-second of the LLM's GPU. vLLM on one H100/H200 class GPU serves a 20-30B model
# at a few thousand tokens/s summed over concurrent requests (prefill much faster, decode slower): 1 ms a token is the
# right order, and it puts a 4,000-token exchange at 4 s, about one full-size evaluation's device time.
SECONDS_PER_TOKEN = 1e-3
# The prior pull: a 5% step (log2 1.05 = 0.07), what a first try of any arm is assumed to find.
PRIOR_GAIN = math.log2(1.05)
EXPLORATION = 1.0  # weight of the bonus sqrt(2 ln N / n), in units of the best arm's gain per second
LLM_PREFIX = "llm"
TUNE = "tune"


def parse_names(spec: str) -> list[str]:
    """`tune,llm:qwen` -> ["tune", "llm:qwen"]; ApplianceError naming what works for anything else."""
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise ApplianceError("--proposer is empty: give tune, llm, llm:PROFILE or a comma-separated list of them")
    for name in names:
        kind, _, profile = name.partition(":")
        if name == TUNE or name == LLM_PREFIX or (kind == LLM_PREFIX and profile):
            continue
        raise ApplianceError(f"--proposer takes tune, llm (APPLIANCE_LLM_URL) or llm:PROFILE (a model profile, "
                             f"`appliance model list`), comma-separated for several; not {name!r}")
    if len(set(names)) != len(names):
        raise ApplianceError(f"--proposer names a proposer twice: {spec!r}")
    return names


def build(names: list[str], settings, seed: int) -> list:
    """The proposers of these names (parse_names), from the host's Settings: the registry below, by kind."""
    return [REGISTRY[name.partition(":")[0]](name, settings, seed) for name in names]


def _tuner(name: str, settings, seed: int):
    from appliance.proposers.tune import TuneProposer

    return TuneProposer(random.Random(seed))


def _llm(name: str, s, seed: int):
    """`llm`: the endpoint of the environment (Settings.llm_*); `llm:PROFILE`: the model a profile serves."""
    from appliance.proposers.llm import LLMProposer, LLMSettings

    profile_name = name.partition(":")[2]
    if profile_name:
        from appliance.models import load_profile

        profile = load_profile(profile_name)
        max_tokens = s.llm_max_tokens if s.llm_max_tokens_set or not profile.max_tokens else profile.max_tokens
        return LLMProposer(LLMSettings(base_url=profile.base_url, model=profile.served_name, api_key=s.llm_api_key,
                                       max_tokens=max_tokens, seed=seed), name=name)
    if not s.llm_url:
        raise ApplianceError("the llm proposer needs APPLIANCE_LLM_URL (and APPLIANCE_LLM_MODEL), or name a model "
                             "profile (--proposer llm:PROFILE, `appliance model list`); "
                             "`appliance optimize --proposer tune` works without one")
    return LLMProposer(LLMSettings(base_url=s.llm_url, model=s.llm_model, api_key=s.llm_api_key,
                                   max_tokens=s.llm_max_tokens, seed=seed), name=name)


REGISTRY = {TUNE: _tuner, LLM_PREFIX: _llm}  # kind -> factory(name, settings, seed)


def uses_llm(names: list[str]) -> bool:
    return any(n.partition(":")[0] == LLM_PREFIX for n in names)


@dataclass
class Yield:
    """One proposer's record in a run. `pulls` counts its proposals, evaluated or not, failures included."""

    proposer: str
    pulls: int = 0
    evaluated: int = 0
    passed: int = 0
    pending: int = 0  # queued or being evaluated: no cost known yet
    empty: int = 0  # answers that gave nothing new (a tuner out of settings, duplicates): no row, kept in run state
    improved: int = 0  # passed and beat their parent
    gain: float = 0.0  # sum of log2(speedup over the parent) of those that did
    gpu_s: float = 0.0
    tokens: int = 0

    @property
    def cost_s(self) -> float:
        return self.gpu_s + self.tokens * SECONDS_PER_TOKEN

    @property
    def gain_per_hour(self) -> float | None:
        """log2-speedup found per hour of cost (GPU-hours and token time together); None before any cost."""
        return self.gain / self.cost_s * 3600 if self.cost_s > 0 else None

    def as_dict(self) -> dict:
        return {"proposer": self.proposer, "proposed": self.pulls, "evaluated": self.evaluated,
                "passed": self.passed, "improved": self.improved, "gain_log2": round(self.gain, 4),
                "gpu_s": round(self.gpu_s, 2), "tokens": self.tokens,
                "gain_per_hour": None if self.gain_per_hour is None else round(self.gain_per_hour, 3)}


def describe(y: Yield, device_seconds: str = "GPU-s") -> str:
    """One short line of a proposer's yield, for `optimize`, `runs` and the TUI: how many of its proposals were
    faster than their parent ("better"), the speed those found together, and what it cost."""
    found = f" (x{2 ** y.gain:.3g})" if y.improved else ""
    tokens = f", {y.tokens} tok" if y.tokens else ""
    return f"{y.proposer}: {y.improved} of {y.pulls} better{found}, {y.gpu_s:.0f} {device_seconds}{tokens}"


def run_yields(config: dict | None, rows: list) -> list[Yield]:
    """The yield of each proposer a run was configured with (and of any other that proposed in it)."""
    try:
        names = parse_names((config or {}).get("proposer") or "")
    except ApplianceError:
        names = []
    return list(yields(rows, names).values())


def evaluation_cost_s(evaluation) -> float:
    """The device seconds an evaluation is charged: its turns on the GPU; on the CPU, its processes' wall time."""
    details = evaluation.details or {}
    if evaluation.device == "cuda":
        return float((details.get("device_turns") or {}).get("held_s") or 0.0)
    walls = details.get("wall_s") or {}
    return float(sum(v for v in walls.values() if isinstance(v, (int, float))))


def yields(rows: list, names: list[str] | None = None) -> dict[str, Yield]:
    """Each proposer's yield from a run's (candidate, evaluation) rows; seeds and hand submissions are not proposers
    of the run, but every name in `names` is listed, tried or not."""
    out = {n: Yield(n) for n in names or []}
    by_id = {c.id: (c, e) for c, e in rows}
    for c, e in rows:
        if c.proposer in ("seed", "compile", "manual"):
            continue
        y = out.setdefault(c.proposer, Yield(c.proposer))
        y.pulls += 1
        y.tokens += (c.tokens_in or 0) + (c.tokens_out or 0)
        if e is None:
            y.pending += c.status != "proposal_failed"
            continue
        y.evaluated += 1
        y.gpu_s += evaluation_cost_s(e)
        if e.verdict != "pass" or not e.speedup_vs_eager:
            continue
        y.passed += 1
        parent = by_id.get(c.parent_id, (None, None))[1]
        if parent is not None and parent.verdict == "pass" and parent.speedup_vs_eager:
            step = math.log2(e.speedup_vs_eager / parent.speedup_vs_eager)
            if step > 0:
                y.improved += 1
                y.gain += step
    return out


class Bandit:
    """Upper-confidence choice of a proposer by gain per second of cost (see the module's docstring)."""

    def __init__(self, names: list[str], exploration: float = EXPLORATION):
        self.names, self.exploration = list(names), exploration

    def choose(self, stats: dict[str, Yield], rng: random.Random, allowed: list[str] | None = None,
               virtual: dict[str, int] | None = None) -> str:
        arms = [n for n in self.names if allowed is None or n in allowed]
        if not arms:
            raise ValueError("no proposer to choose from")
        if len(arms) == 1:
            return arms[0]
        virtual = virtual or {}
        evaluated = sum(y.evaluated for y in stats.values())
        mean_cost = max(sum(y.gpu_s for y in stats.values()) / evaluated, 1e-3) if evaluated else 1.0
        pulls = {n: (stats.get(n) or Yield(n)).pulls + (stats.get(n) or Yield(n)).empty + virtual.get(n, 0) + 1
                 for n in arms}  # + the prior pull

        def rate(name: str, chosen: int) -> float:
            """Gain per second of cost. Pulls with no cost known yet (queued, in flight, chosen in this
            generation), empty answers and the prior pull cost an average evaluation (an arm that keeps answering
            with nothing new loses its turn to the others); a failed proposal costs its tokens."""
            y = stats.get(name) or Yield(name)
            return (y.gain + PRIOR_GAIN) / (y.cost_s + (y.pending + y.empty + chosen + 1) * mean_cost)

        rates = {n: rate(n, virtual.get(n, 0)) for n in arms}
        # The bonus's scale: the best rate before this generation's choices (which would shrink it as they add up).
        best, total = max(rate(n, 0) for n in arms), sum(pulls.values())

        def index(name: str) -> float:
            return rates[name] + self.exploration * best * math.sqrt(2 * math.log(total) / pulls[name])

        scored = [(index(n), rng.random(), n) for n in arms]
        return max(scored)[2]
