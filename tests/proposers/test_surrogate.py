"""The tuner's model of a family's times (appliance/proposers/surrogate.py): it finds the fastest setting of a large
space from a few timed ones, and the tuner proposes it once the family has enough timed members."""

from __future__ import annotations

import itertools
import math
import random

from appliance.proposers.base import Example, Measured, PromptContext
from appliance.proposers.surrogate import MIN_POINTS, fit, key
from appliance.proposers.tune import TuneProposer, current_values, with_values
from tests.proposers.test_tune import PARENT

SPACE = {"BLOCK": [128, 256, 512, 1024, 2048, 4096], "WARPS": [1, 2, 4, 8, 16, 32], "STAGES": [1, 2, 3, 4, 5],
         "SPLIT": [False, True]}


def true_ms(s: dict) -> float:
    """A kernel whose time is a product of effects (best: BLOCK 1024, WARPS 8, STAGES 3, SPLIT True), with a
    little interaction the model does not know of."""
    return (0.5 * (1 + 0.3 * abs(math.log2(s["BLOCK"] / 1024))) * (1 + 0.2 * abs(math.log2(s["WARPS"] / 8)))
            * (1 + 0.05 * abs(s["STAGES"] - 3)) * (0.9 if s["SPLIT"] else 1.0)
            * (1.03 if s["BLOCK"] >= 2048 and s["WARPS"] <= 2 else 1.0))


def test_from_a_dozen_timed_settings_of_360_the_model_names_one_near_the_fastest():
    rng = random.Random(0)
    everything = [dict(zip(SPACE, combo)) for combo in itertools.product(*SPACE.values())]
    best = min(everything, key=true_ms)
    timed = [s for s in rng.sample(everything, 12) if key(s) != key(best)]
    model = fit([(s, true_ms(s)) for s in timed], SPACE)
    (found, predicted), = model.fastest(exclude={key(s) for s in timed})
    # Better than every setting timed, and within 6% of the best of all 360 (a weak tunable, STAGES, may be off).
    assert true_ms(found) < min(true_ms(s) for s in timed) and true_ms(found) <= 1.06 * true_ms(best), (found, best)
    assert found["BLOCK"] == best["BLOCK"] and found["WARPS"] == best["WARPS"] and predicted > 0


def test_no_model_before_min_points_or_from_unusable_points():
    points = [({"BLOCK": 128, "WARPS": 1, "STAGES": 1, "SPLIT": False}, 1.0)] * (MIN_POINTS - 1)
    assert fit(points, SPACE) is None
    off_list = [({"BLOCK": 100, "WARPS": 1, "STAGES": 1, "SPLIT": False}, 1.0)] * MIN_POINTS  # 100 is not listed
    assert fit(off_list, SPACE) is None
    assert fit([(p, 0.0) for p, _ in points * 2], SPACE) is None  # no time, no point


def test_the_tuner_proposes_the_models_pick_once_the_family_has_enough_timed_members():
    tuner = TuneProposer(random.Random(0))

    def ms(source: str) -> float:  # wider blocks and more warps are faster, each alone a little
        v = current_values(source)
        return 1.0 / (1 + math.log2(v["MAX_BLOCK"] / 1024) * 0.05) / (1 + math.log2(v["NUM_WARPS"] / 2) * 0.05)

    timed = [with_values(PARENT, {"MAX_BLOCK": b, "NUM_WARPS": w})
             for b, w in ((1024, 2), (4096, 8), (2048, 4), (8192, 2), (1024, 16))]
    ctx = PromptContext(task_name="t", task_source="", parent=Example(PARENT, label="parent"),
                        measured=[Measured(s, ms(s)) for s in timed])
    proposals = tuner.propose(ctx, 2, seen=set())
    modelled = [p for p in proposals if p.note.startswith("model (5 timed)")]
    assert len(modelled) == 1, [p.note for p in proposals]
    # The fastest value of each tunable seen (8192 and 16, never timed together), combined; values never timed
    # count as average (the model does not extrapolate: the one-step moves and random jumps go there).
    assert current_values(modelled[0].source) == {"MAX_BLOCK": 8192, "NUM_WARPS": 16}
    # Too few timed members: no model yet, the usual moves.
    ctx.measured = ctx.measured[:MIN_POINTS - 1]
    assert not any(p.note.startswith("model") for p in tuner.propose(ctx, 2, seen=set()))


def test_huge_declared_spaces_cost_bounded_work():
    """TUNABLES come from candidates (an LLM's): a declaration of thousands of values must not stall the tuner."""
    import time

    wide = {f"T{i}": list(range(150)) for i in range(12)}  # 1,800 values, 3.5 million settings two changes away
    points = [({n: (i * 7 + j) % 150 for j, n in enumerate(wide)}, 1.0 + i / 10) for i in range(6)]
    started = time.monotonic()
    model = fit(points, wide)
    (found, _), = model.fastest(exclude=set())
    assert found and time.monotonic() - started < 20
    assert fit(points, {f"T{i}": list(range(400)) for i in range(6)}) is None  # past MAX_COLUMNS: no model
