"""appliance.proposers.tune: reading and rewriting a candidate's declared tunable constants (pure functions of text),
the tuning proposer's coordinate moves, `seen` skipping and exhaustion, and a tuned baseline through the real gate."""

from __future__ import annotations

import difflib
import random

import pytest

from appliance.proposers.base import Example, Measured, PromptContext
from appliance.proposers.edits import source_hash
from appliance.proposers.tune import (TuneError, TuneProposer, current_values, neighbours, per_shape_proposal,
                                      read_per_shape, read_tunables, with_per_shape, with_values)
from tests.conftest import REPO

SOFTMAX_TASK = REPO / "benchmarks" / "tasks" / "softmax.py"
SOFTMAX_BASELINE = REPO / "benchmarks" / "baselines" / "softmax.py"

PARENT = '''\
"""A kernel with two tunables."""
import torch.nn as nn

# Tunables: the tuning proposer rewrites these constants.
MAX_BLOCK = 4096  # widest chunk
NUM_WARPS = 8
TUNABLES = {"MAX_BLOCK": [1024, 2048, 4096, 8192, 16384], "NUM_WARPS": [2, 4, 8, 16, 32]}


class ModelNew(nn.Module):
    def forward(self, x):
        block = min(x.shape[-1], MAX_BLOCK)  # MAX_BLOCK = 4096 in a comment stays
        return x * (block + NUM_WARPS)
'''

NO_TUNABLES = '''\
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x
'''


def one_step(seed) -> TuneProposer:
    """A tuner that only walks (no random jumps): what these tests pin down is the walk."""
    return TuneProposer(random.Random(seed), explore=0)


def ctx(source: str) -> PromptContext:
    return PromptContext(task_name="t", task_source="", parent=Example(source, label="parent"))


def changed_lines(a: str, b: str) -> list[str]:
    return [line for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def error_of(source: str) -> str:
    with pytest.raises(TuneError) as info:
        read_tunables(source)
    return str(info.value)


# --- reading and rewriting ---------------------------------------------------------------------------------------

def test_read_tunables_and_current_values():
    assert read_tunables(PARENT) == {"MAX_BLOCK": [1024, 2048, 4096, 8192, 16384], "NUM_WARPS": [2, 4, 8, 16, 32]}
    assert current_values(PARENT) == {"MAX_BLOCK": 4096, "NUM_WARPS": 8}
    assert read_tunables(NO_TUNABLES) == {} and current_values(NO_TUNABLES) == {}


def test_with_values_changes_only_the_constant_lines_and_keeps_comments():
    out = with_values(PARENT, {"MAX_BLOCK": 8192, "NUM_WARPS": 16})
    assert changed_lines(PARENT, out) == ["-MAX_BLOCK = 4096  # widest chunk", "-NUM_WARPS = 8",
                                          "+MAX_BLOCK = 8192  # widest chunk", "+NUM_WARPS = 16"]
    assert current_values(out) == {"MAX_BLOCK": 8192, "NUM_WARPS": 16}
    assert read_tunables(out) == read_tunables(PARENT)
    assert with_values(out, {"MAX_BLOCK": 4096, "NUM_WARPS": 8}) == PARENT  # byte-identical round trip
    assert with_values(PARENT, {}) == PARENT


def test_with_values_literal_kinds_and_odd_layouts():
    source = ('x = "\u00e9t\u00e9"; MODE = "fast"  # after a non-ASCII string on the same line\r\n'
              "SCALE: float = (\r\n    0.5\r\n)\r\nON = True\r\nTUNABLES = {'MODE': ['fast', 'safe'], "
              "'SCALE': [0.25, 0.5, 1.0], 'ON': [False, True]}\r\n")
    out = with_values(source, {"MODE": "safe", "SCALE": 1.0, "ON": False})
    assert current_values(out) == {"MODE": "safe", "SCALE": 1.0, "ON": False}
    assert out == ('x = "\u00e9t\u00e9"; MODE = \'safe\'  # after a non-ASCII string on the same line\r\n'
                   "SCALE: float = (\r\n    1.0\r\n)\r\nON = False\r\n" + source.split("ON = True\r\n")[1])


def test_with_values_rejects_what_it_cannot_write():
    with pytest.raises(TuneError, match="no top-level `OTHER = <literal>`"):
        with_values(PARENT, {"OTHER": 1})
    with pytest.raises(TuneError, match="use ints, floats, bools or strings"):
        with_values(PARENT, {"MAX_BLOCK": [1, 2]})
    with pytest.raises(TuneError, match="not a finite number"):
        with_values(PARENT, {"MAX_BLOCK": float("inf")})


def test_neighbours_one_step_in_list_order_and_nearest_for_unlisted_values():
    values = [1024, 2048, 4096, 8192]
    assert neighbours(values, 4096) == [2048, 8192]
    assert neighbours(values, 1024) == [2048]
    assert neighbours(values, 8192) == [4096]
    assert neighbours(values, 3000) == [2048, 4096]
    assert neighbours(values, 99999) == [8192]
    assert neighbours(["a", "b", "c"], "z") == ["a", "b", "c"]
    assert neighbours([False, True], True) == [False]
    assert neighbours([0, 1, 2], True) == [0, 1, 2]  # True is not the number 1 here


@pytest.mark.parametrize("declaration, message", [
    ("TUNABLES = dict(MAX_BLOCK=[1024])", "must be assigned alone a dict literal"),
    ("TUNABLES = {'MAX_BLOCK': [1024, SIZE]}", "must hold only literals"),
    ("TUNABLES = {'MAX_BLOCK': []}", "must be a non-empty list"),
    ("TUNABLES = {'MAX_BLOCK': 4096}", "must be a non-empty list"),
    ("TUNABLES = {'MAX_BLOCK': [1024, 1024]}", "lists 1024 twice"),
    ("TUNABLES = {'MAX_BLOCK': [1, 2, 1.0]}", "lists 1.0 twice"),
    (f"TUNABLES = {{'MAX_BLOCK': {list(range(300))}}}", "lists 300 values; at most 256"),
    ("TUNABLES = {'MAX_BLOCK': [1024, None]}", "None is a NoneType"),
    ("TUNABLES = {'MAX-BLOCK': [1024]}", "is not a constant name"),
    ("TUNABLES = {'MISSING': [1]}", "MISSING has no top-level `MISSING = <literal>` assignment"),
    ("TUNABLES = {'COMPUTED': [1]}\nCOMPUTED = 2 ** 10", "COMPUTED (line 3) is not assigned a literal"),
    ("TUNABLES = {'A': [1]}\nA = B = 1", "A (line 3) must be assigned alone"),
    ("TUNABLES = {'A': [1]}\nA = 1\nA += 1", "A is assigned 2 times at top level (lines 3, 4)"),
    ("TUNABLES = {'A': [1]}\nTUNABLES = {'A': [2]}\nA = 1", "TUNABLES is assigned 2 times"),
    ("TUNABLES = {'A': [1]}\nA = [1]", "[1] is a list"),
    ("TUNABLES = {'A': [1]}\nA = (", "source does not parse: line 3"),
])
def test_bad_declarations_raise_specific_errors(declaration, message):
    assert message in error_of(f"import torch\n{declaration}\n")


def test_a_current_value_outside_its_list_is_allowed():
    source = PARENT.replace("MAX_BLOCK = 4096", "MAX_BLOCK = 3000")
    assert current_values(source)["MAX_BLOCK"] == 3000
    notes = [p.note for p in one_step(0).propose(ctx(source), 4)]
    assert "MAX_BLOCK 3000->2048 (parent's MAX_BLOCK not in TUNABLES)" in notes
    assert "MAX_BLOCK 3000->4096 (parent's MAX_BLOCK not in TUNABLES)" in notes


def test_constants_inside_functions_or_branches_do_not_count():
    source = "def f():\n    A = 1\n\nif True:\n    A = 2\nTUNABLES = {'A': [1, 2]}\n"
    assert "A has no top-level" in error_of(source)


# --- the proposer ------------------------------------------------------------------------------------------------

def test_proposes_the_one_step_neighbours_first_in_a_seeded_random_order():
    proposals = one_step(1).propose(ctx(PARENT), 4)
    notes = [p.note for p in proposals]
    assert sorted(notes) == sorted(["MAX_BLOCK 4096->2048", "MAX_BLOCK 4096->8192", "NUM_WARPS 8->4",
                                    "NUM_WARPS 8->16"])
    assert notes == [p.note for p in one_step(1).propose(ctx(PARENT), 4)]
    orders = {tuple(p.note for p in one_step(seed).propose(ctx(PARENT), 4)) for seed in range(20)}
    assert len(orders) > 1
    for p in proposals:
        assert (p.proposer, p.mode, p.failure) == ("tune", "tune", None)
        assert len(changed_lines(PARENT, p.source)) == 2  # one constant line out, one in
    assert len({source_hash(p.source) for p in proposals}) == 4


def test_fills_up_with_distinct_random_combinations():
    proposals = one_step(0).propose(ctx(PARENT), 10)
    assert len(proposals) == 10
    hashes = {source_hash(p.source) for p in proposals}
    assert len(hashes) == 10 and source_hash(PARENT) not in hashes
    combos = [p for p in proposals[4:] if ", " in p.note]
    assert combos, "expected some proposals to change both tunables"
    for p in proposals:
        values = current_values(p.source)
        assert values["MAX_BLOCK"] in read_tunables(PARENT)["MAX_BLOCK"]
        assert values["NUM_WARPS"] in read_tunables(PARENT)["NUM_WARPS"]


def test_a_share_of_proposals_jumps_anywhere_in_the_space():
    """One-step moves alone stay in a basin whose way out is several moves long: a share of the proposals are
    random settings of the whole space, distinct, unseen and listed; with the default share, some of every batch."""
    tunables = read_tunables(PARENT)
    steps = {(name, v) for name in tunables for v in neighbours(tunables[name], current_values(PARENT)[name])}

    def is_one_step(p) -> bool:
        changed = {k: v for k, v in current_values(p.source).items() if v != current_values(PARENT)[k]}
        return len(changed) == 1 and next(iter(changed.items())) in steps

    jumping = TuneProposer(random.Random(0), explore=1.0).propose(ctx(PARENT), 8)
    assert len({source_hash(p.source) for p in jumping}) == 8
    assert sum(not is_one_step(p) for p in jumping) >= 6  # a random setting is a one-step move 4 times in 24
    assert all(current_values(p.source)[k] in tunables[k] for p in jumping for k in tunables)
    seen = {source_hash(p.source) for p in jumping}
    again = TuneProposer(random.Random(0), explore=1.0).propose(ctx(PARENT), 8, seen=seen)
    assert not seen & {source_hash(p.source) for p in again}
    default = [TuneProposer(random.Random(s)).propose(ctx(PARENT), 4) for s in range(20)]
    jumps = sum(not is_one_step(p) for batch in default for p in batch)
    assert 0.1 * 80 <= jumps <= 0.45 * 80, jumps  # EXPLORE_SHARE of them, give or take chance
    assert one_step(0).propose(ctx(PARENT), 4) and all(is_one_step(p) for p in one_step(0).propose(ctx(PARENT), 4))


def test_skips_seen_sources():
    seen = {source_hash(with_values(PARENT, {"MAX_BLOCK": 8192})), source_hash(with_values(PARENT, {"NUM_WARPS": 4}))}
    notes = [p.note for p in one_step(0).propose(ctx(PARENT), 2, seen=seen)]
    assert sorted(notes) == ["MAX_BLOCK 4096->2048", "NUM_WARPS 8->16"]
    # A seen variant that differs only in comments is still a duplicate.
    commented = with_values(PARENT, {"MAX_BLOCK": 2048}).replace("# widest chunk", "# tried already")
    seen.add(source_hash(commented))
    notes = [p.note for p in one_step(0).propose(ctx(PARENT), 4, seen=seen)]
    assert "MAX_BLOCK 4096->2048" not in notes and "NUM_WARPS 8->16" in notes and len(notes) == 4


def test_exhausted_when_every_variant_was_seen():
    seen = set()
    for block in [1024, 2048, 4096, 8192, 16384]:
        for warps in [2, 4, 8, 16, 32]:
            seen.add(source_hash(with_values(PARENT, {"MAX_BLOCK": block, "NUM_WARPS": warps})))
    [p] = TuneProposer(random.Random(0)).propose(ctx(PARENT), 3, seen=seen)
    assert p.source is None and p.proposer == "tune"
    assert p.failure.startswith("tune_exhausted: ") and "MAX_BLOCK, NUM_WARPS" in p.failure
    # One unseen combination left: it is found.
    seen.discard(source_hash(with_values(PARENT, {"MAX_BLOCK": 1024, "NUM_WARPS": 32})))
    [p] = TuneProposer(random.Random(0)).propose(ctx(PARENT), 3, seen=seen)
    assert p.note == "MAX_BLOCK 4096->1024, NUM_WARPS 8->32"


def test_a_single_listed_value_has_nothing_to_try():
    source = "A = 1\nTUNABLES = {'A': [1]}\n"
    [p] = TuneProposer(random.Random(0)).propose(ctx(source), 2)
    assert p.source is None and p.failure.startswith("tune_exhausted: ")


def test_parent_without_tunables_or_with_a_broken_declaration_is_a_recorded_failure():
    proposer = TuneProposer(random.Random(0))
    [p] = proposer.propose(ctx(NO_TUNABLES), 4)
    assert p.source is None and p.failure.startswith("no_tunables: the parent has nothing to tune: it declares no "
                                                     "TUNABLES dict, and its Triton launches have no literal block")
    [p] = proposer.propose(ctx(NO_TUNABLES + "TUNABLES = {}\n"), 4)
    assert p.failure == "no_tunables: the parent has nothing to tune: its TUNABLES dict is empty"
    [p] = proposer.propose(ctx(PARENT.replace('"NUM_WARPS": [', '"NUM_WARPZ": [')), 4)
    assert p.source is None and p.failure.startswith("bad_tunables: NUM_WARPZ has no top-level")
    [p] = proposer.propose(ctx("def broken(:\n"), 4)
    assert p.failure.startswith("bad_tunables: source does not parse")
    assert proposer.propose(ctx(PARENT), 0) == []


def test_the_baselines_declare_tunables_whose_defaults_are_listed():
    for name in ("softmax", "rmsnorm", "layernorm"):
        source = (REPO / "benchmarks" / "baselines" / f"{name}.py").read_text()
        tunables, current = read_tunables(source), current_values(source)
        assert {"MAX_BLOCK": 4096, "NUM_WARPS": 8}.items() <= current.items(), name
        assert all(current[k] in tunables[k] for k in tunables), name
        assert read_per_shape(source) == {}, name


# --- per shape ---------------------------------------------------------------------------------------------------

PER_SHAPE = PARENT.replace("NUM_WARPS = 8\n", "NUM_WARPS = 8\nTUNED_BY_SHAPE = {}  # filled in by the tuner\n")
WIDE, NARROW = (4096, 65536), (3, 37)


def variant(block: int, warps: int = 8, table: dict | None = None) -> str:
    source = with_values(PER_SHAPE, {"MAX_BLOCK": block, "NUM_WARPS": warps})
    return with_per_shape(source, table) if table else source


def test_per_shape_table_reads_and_rewrites_only_its_own_lines():
    assert read_per_shape(PARENT) is None and read_per_shape(PER_SHAPE) == {}
    table = {NARROW: {"MAX_BLOCK": 1024}, (1, 1): {"MAX_BLOCK": 1024, "NUM_WARPS": 2}}
    out = with_per_shape(PER_SHAPE, table)
    assert read_per_shape(out) == table and current_values(out) == current_values(PER_SHAPE)
    assert changed_lines(PER_SHAPE, out)[0] == "-TUNED_BY_SHAPE = {}  # filled in by the tuner"
    assert with_per_shape(out, {}) == PER_SHAPE  # byte-identical round trip
    for bad, message in [("{(4, 'x'): {}}", "is not a shape"), ("{(4,): {'OTHER': 1}}", "must map declared"),
                         ("{(4,): {'MAX_BLOCK': [1]}}", "use ints, floats"), ("dict()", "a dict literal")]:
        with pytest.raises(TuneError, match=message):
            read_per_shape(PER_SHAPE.replace("TUNED_BY_SHAPE = {}", f"TUNED_BY_SHAPE = {bad}"))


def test_each_shape_gets_the_settings_that_were_fastest_there_on_the_fastest_main():
    measured = [Measured(variant(4096), 1.00, {NARROW: 0.020, (1, 1): 0.010}),
                Measured(variant(1024), 1.30, {NARROW: 0.012, (1, 1): 0.0101}),  # (1, 1): within noise
                Measured(variant(2048, 4), 1.10, {NARROW: 0.015, (1, 1): 0.011}),
                Measured(PARENT, 0.50, {NARROW: 0.001})]  # another family (no table): not comparable
    source, note = per_shape_proposal(variant(2048, 4), measured)  # any member as parent: the fastest is the base
    assert current_values(source) == {"MAX_BLOCK": 4096, "NUM_WARPS": 8}
    assert read_per_shape(source) == {NARROW: {"MAX_BLOCK": 1024}}
    assert note == "per shape: (3, 37): MAX_BLOCK 1024 (0.02 -> 0.012 ms)"
    # Once measured, the same candidate comes again (the proposer skips it as seen), or nothing when it is the base.
    assert per_shape_proposal(source, measured + [Measured(source, 1.0, {NARROW: 0.012})])[0] == source
    assert per_shape_proposal(source, measured + [Measured(source, 0.99, {NARROW: 0.012})]) is None
    # A table entry goes again when the constants turn out faster there.
    later = [Measured(source, 1.0, {NARROW: 0.030}), Measured(variant(2048), 1.2, {NARROW: 0.010})]
    assert read_per_shape(per_shape_proposal(source, later)[0]) == {NARROW: {"MAX_BLOCK": 2048}}


def test_no_per_shape_proposal_without_a_table_or_evidence():
    assert per_shape_proposal(PARENT, [Measured(PARENT, 1.0, {NARROW: 1.0})] * 2) is None  # no table declared
    assert per_shape_proposal(variant(4096), [Measured(variant(4096), 1.0, {NARROW: 1.0})]) is None  # one member
    close = [Measured(variant(4096), 1.0, {NARROW: 0.0200}), Measured(variant(1024), 1.2, {NARROW: 0.0197})]
    assert per_shape_proposal(variant(4096), close) is None  # 1.5% faster: noise, not a reason


def test_the_proposer_offers_the_per_shape_candidate_first_and_only_once():
    measured = [Measured(variant(4096), 1.0, {NARROW: 0.02}), Measured(variant(1024), 1.3, {NARROW: 0.01})]
    first, *moves = one_step(0).propose(
        PromptContext(task_name="t", task_source="", parent=Example(variant(4096)), measured=measured), 3)
    assert first.note.startswith("per shape: ") and read_per_shape(first.source) == {NARROW: {"MAX_BLOCK": 1024}}
    assert len(moves) == 2 and all("->" in p.note and "per shape" not in p.note for p in moves)
    again = one_step(0).propose(
        PromptContext(task_name="t", task_source="", parent=Example(variant(4096)), measured=measured), 3,
        seen={source_hash(first.source)})
    assert not any(p.note.startswith("per shape") for p in again)
    broken = variant(4096).replace("TUNED_BY_SHAPE = {}", "TUNED_BY_SHAPE = {1: 2}")
    assert all("->" in p.note for p in one_step(0).propose(  # a broken table: moves still come
        PromptContext(task_name="t", task_source="", parent=Example(broken), measured=measured), 2))


def test_the_tuner_never_answers_with_more_proposals_than_asked():
    """A per-shape (or cached, or modelled) proposal plus random jumps once made two answers to a request for one:
    a run sized to its budget then left a candidate unevaluated (seen as a flaky resume test in CI)."""
    measured = [Measured(variant(4096), 1.0, {NARROW: 0.02}), Measured(variant(1024), 1.3, {NARROW: 0.01})]
    for seed in range(40):
        for n in (1, 2, 3):
            got = TuneProposer(random.Random(seed), explore=1.0).propose(
                PromptContext(task_name="t", task_source="", parent=Example(variant(4096)), measured=measured), n)
            assert len(got) == n and got[0].note.startswith("per shape: "), (seed, n, [p.note for p in got])


# --- through the real gate ---------------------------------------------------------------------------------------

def test_a_tuned_softmax_baseline_passes_the_real_cpu_gate(appliance, tmp_path):
    parent = SOFTMAX_BASELINE.read_text()
    [proposal] = [p for p in one_step(0).propose(ctx(parent), 4) if p.note == "MAX_BLOCK 4096->2048"]
    assert changed_lines(parent, proposal.source) == ["-MAX_BLOCK = 4096", "+MAX_BLOCK = 2048"]
    variant = tmp_path / "softmax_tuned.py"
    variant.write_text(proposal.source)
    code, result = appliance.eval_json(SOFTMAX_TASK, variant)
    assert code == 0, result
    assert result["verdict"] == "pass" and result["passed"] is True
