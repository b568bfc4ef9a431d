"""Several proposers in one run: the names, each proposer's yield from the run's rows, and the bandit that gives
slots to the proposer with the best gain per second of cost. The loop runs on a real SQLite store with a
ReplayEvaluator whose verdicts are decided by the candidate's text (no jail: what is under test is who proposes)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from appliance.errors import ApplianceError
from appliance.evaluation.pipeline import Outcome
from appliance.evaluation.replay import ReplayEvaluator
from appliance.proposers.base import Proposal, Traits
from appliance.proposers.mix import PRIOR_GAIN, SECONDS_PER_TOKEN, Bandit, Yield, parse_names, yields
from appliance.search.loop import Optimizer
from appliance.tasks import load_task
from tests.search.test_loop_faults import SOFTMAX, make_run


def test_names_are_tune_llm_or_llm_with_a_profile_and_anything_else_says_what_works():
    assert parse_names("tune") == ["tune"]
    assert parse_names(" tune, llm:qwen ,llm:devstral") == ["tune", "llm:qwen", "llm:devstral"]
    for bad, said in (("", "empty"), ("tuner", "llm:PROFILE"), ("llm:", "llm:PROFILE"), ("tune,tune", "twice")):
        with pytest.raises(ApplianceError, match=said):
            parse_names(bad)


def arms(**records) -> dict[str, Yield]:
    return {name: Yield(name, **fields) for name, fields in records.items()}


def test_an_arm_never_tried_is_tried_before_a_productive_one_is_tried_again():
    stats = arms(tune=dict(pulls=6, evaluated=6, passed=6, improved=2, gain=0.3, gpu_s=30.0))
    assert Bandit(["tune", "llm"]).choose(stats, random.Random(0)) == "llm"


def test_the_same_gain_for_less_cost_wins_and_tokens_count_as_cost():
    tuner = dict(pulls=10, evaluated=10, passed=10, improved=3, gain=0.4, gpu_s=50.0)
    # The LLM found as much, for the same GPU time, but paid 200,000 tokens (200 s at SECONDS_PER_TOKEN) for it.
    llm = dict(pulls=10, evaluated=10, passed=8, improved=3, gain=0.4, gpu_s=50.0, tokens=200_000)
    stats = arms(tune=tuner, llm=llm)
    assert stats["llm"].cost_s == pytest.approx(50.0 + 200_000 * SECONDS_PER_TOKEN)
    assert Bandit(["tune", "llm"]).choose(stats, random.Random(0)) == "tune"
    # Ten times the gain for the same cost outweighs the tokens.
    stats["llm"].gain = 4.0
    assert Bandit(["tune", "llm"]).choose(stats, random.Random(0)) == "llm"


def test_a_generation_spreads_over_close_arms_and_a_barren_arm_still_gets_an_occasional_try():
    stats = arms(a=dict(pulls=8, evaluated=8, improved=3, gain=0.5, gpu_s=40.0),
                 b=dict(pulls=8, evaluated=8, improved=3, gain=0.45, gpu_s=40.0),
                 barren=dict(pulls=8, evaluated=8, gain=0.0, gpu_s=40.0))
    bandit, rng, virtual = Bandit(["a", "b", "barren"]), random.Random(1), {}
    chosen = []
    for _ in range(40):  # one long generation: each choice counts as a pull already made
        name = bandit.choose(stats, rng, virtual=virtual)
        virtual[name] = virtual.get(name, 0) + 1
        chosen.append(name)
    assert chosen[:2] in (["a", "b"], ["b", "a"])  # close arms share a generation
    assert chosen.count("a") + chosen.count("b") > chosen.count("barren") > 0


def test_choices_repeat_under_the_same_rng_and_only_allowed_arms_are_chosen():
    stats = arms(a=dict(pulls=1, evaluated=1, gpu_s=5.0), b=dict(pulls=1, evaluated=1, gpu_s=5.0))
    first = [Bandit(["a", "b"]).choose(stats, random.Random(7)) for _ in range(3)]
    assert len(set(first)) == 1
    assert Bandit(["a", "b"]).choose(stats, random.Random(7), allowed=["b"]) == "b"
    with pytest.raises(ValueError):
        Bandit(["a"]).choose(stats, random.Random(0), allowed=[])


# --- in a run ---

def speed_of(source: str) -> float:
    """The replayed evaluator's verdict: every `STEP_n = 1` a proposer added makes the kernel 10% faster."""
    return 1.1 ** source.count("STEP_")


def replayed(source: str) -> Outcome:
    """The verdict read off the candidate's text (speed_of); one CPU second a candidate."""
    return Outcome(verdict="pass", stage="done", reason="", jailed=True, device="cpu", mode="small",
                   speedup_vs_eager=speed_of(source), details={"wall_s": {"server": 1.0}})


# A kernel the tuner has nothing to move in: no TUNABLES and no Triton launch (the evaluator here reads only lines).
NOT_TUNABLE = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


class Appender:
    """An LLM-like proposer that appends a line to its parent: `STEP_n = 1` (a 10% gain) or `NOOP_n = 1` (none);
    with strip_tunables, to a kernel the tuner cannot tune (NOT_TUNABLE) in place of a tunable parent."""

    traits = Traits(reads_profiles=True)

    def __init__(self, name: str, line: str, strip_tunables: bool = False, tokens: int = 100):
        self.name, self.line, self.strip, self.tokens = name, line, strip_tunables, tokens
        self.count, self.parents = itertools.count(), []

    def accepts(self, parent_source: str) -> bool:
        return True

    def propose(self, ctx, n, seen=None):
        self.parents.append(ctx.parent.source)
        source = NOT_TUNABLE if self.strip and "TUNABLES = " in ctx.parent.source else ctx.parent.source
        return [Proposal(source=f"{source}\n{self.line}{next(self.count)} = 1\n", proposer=self.name,
                         tokens_in=self.tokens, tokens_out=self.tokens) for _ in range(n)]


def run(tmp_path, proposers, max_candidates):
    store, run_id, cfg, _ = make_run(tmp_path, max_candidates=max_candidates, batch=2)
    summary = Optimizer(store, run_id, load_task(SOFTMAX), [ReplayEvaluator(decide=replayed)], proposers, cfg,
                        tmp_path / "work").run()
    return store, run_id, summary


def test_the_bandit_gives_most_slots_to_the_proposer_that_finds_speed_and_its_yield_says_so(tmp_path):
    good, barren = Appender("llm:good", "STEP_"), Appender("llm:barren", "NOOP_")
    store, run_id, summary = run(tmp_path, [good, barren], max_candidates=24)
    assert summary.evaluated == 24
    stats = yields(store.run_candidates(run_id), ["llm:good", "llm:barren"])
    assert stats["llm:good"].improved > 0 and stats["llm:barren"].improved == 0
    assert stats["llm:good"].gain == pytest.approx(stats["llm:good"].improved * math.log2(1.1))
    assert stats["llm:good"].pulls > 2 * stats["llm:barren"].pulls > 0, (stats["llm:good"], stats["llm:barren"])
    assert stats["llm:good"].gpu_s == stats["llm:good"].evaluated * 1.0
    assert stats["llm:good"].tokens == 200 * stats["llm:good"].pulls
    assert summary.best["proposer"] == "llm:good"


def test_the_tuner_refines_what_declares_tunables_and_leaves_other_parents_to_the_llm(tmp_path):
    """The seed declares TUNABLES, the LLM's candidates have nothing to tune (and are faster, so they become
    parents): those parents go to the LLM, and the tuner records no `no_tunables` failure on them."""
    from appliance.proposers.tune import TuneProposer

    llm = Appender("llm", "STEP_", strip_tunables=True)
    store, run_id, summary = run(tmp_path, [TuneProposer(random.Random(0)), llm], max_candidates=16)
    rows = store.run_candidates(run_id)
    by = {name: [c for c, _ in rows if c.proposer == name] for name in ("tune", "llm")}
    assert by["tune"] and by["llm"], {k: len(v) for k, v in by.items()}
    assert not [c.failure for c, _ in rows if c.status == "proposal_failed"]
    parents = {c.id: c for c, _ in rows}
    assert all("TUNABLES = " in parents[c.parent_id].source for c in by["tune"])
    assert summary.best["proposer"] == "llm"


def test_a_prior_pull_keeps_an_unknown_arms_index_finite():
    y = Yield("x")
    assert y.gain_per_hour is None and y.cost_s == 0.0
    assert Bandit(["x", "y"]).choose({}, random.Random(0)) in ("x", "y")
    assert PRIOR_GAIN > 0


class BigStepThenNothing:
    """A tuner-like proposer whose first answer is a large gain (four steps at once) and every later one is
    `exhausted` (nothing new to offer, which writes no row): its record alone would keep it first forever."""

    traits = Traits(avoids_seen=True)

    def __init__(self):
        self.name, self.asked = "tune", 0

    def accepts(self, parent_source: str) -> bool:
        return True

    def propose(self, ctx, n, seen=None):
        self.asked += 1
        if self.asked == 1:
            return [Proposal(source=ctx.parent.source + "\nSTEP_a = STEP_b = STEP_c = STEP_d = 1\n",
                             proposer=self.name)]
        return [Proposal(source=None, proposer=self.name, kind="exhausted", failure="tune_exhausted: all seen")]


def test_a_proposer_out_of_ideas_gives_its_slots_to_the_others_instead_of_ending_the_run_barren(tmp_path):
    """Seen in review: exhausted answers left no trace, the bandit chose the tuner for every slot, and three such
    generations ended the run with its budget unspent and the LLM never asked."""
    tuner, llm = BigStepThenNothing(), Appender("llm", "NOOP_")
    store, run_id, summary = run(tmp_path, [tuner, llm], max_candidates=10)
    assert summary.status == "finished" and summary.evaluated == 10, summary
    rows = store.run_candidates(run_id)
    assert len([c for c, _ in rows if c.proposer == "llm"]) >= 7
    assert store.get_run(run_id).state["empty_answers"]["tune"] > 0
