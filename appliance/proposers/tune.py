"""The tuning proposer: variants of the parent that differ only in the values of its declared tunable constants.

Convention. A candidate declares each tunable as a module-level constant assigned a literal, and one top-level dict
literal `TUNABLES` listing, in order, the values each constant may take (ints, floats, bools or strings):

    # Tunables: the tuning proposer rewrites these constants.
    MAX_BLOCK = 4096
    NUM_WARPS = 8
    TUNABLES = {"MAX_BLOCK": [1024, 2048, 4096, 8192, 16384], "NUM_WARPS": [2, 4, 8, 16, 32]}

The kernel code reads the constants (`block = min(triton.next_power_of_2(n), MAX_BLOCK)`); it never reads TUNABLES.
A neighbour of a value is the value one step before or after it in its list, so order the lists by size. A constant
whose current value is not in its list is allowed (an LLM edit may have set it): its neighbours are the nearest
listed values on either side (numbers), or every listed value (anything else), and the proposal's note says so.

Per shape. One setting rarely suits every shape a task times. A candidate may also declare a table literal
`TUNED_BY_SHAPE`, mapping the shape of its first input (what forward sees as `tuple(x.shape)`) to the settings for
that shape, and read its settings through it:

    TUNED_BY_SHAPE = {}  # the tuner fills this in

    def _settings(x):
        return {"MAX_BLOCK": MAX_BLOCK, "NUM_WARPS": NUM_WARPS} | TUNED_BY_SHAPE.get(tuple(x.shape), {})

The constants stay tuned for the main shape (where speedups are quoted). Once the run has timed a few variants
that differ only in their settings (a "family"), the tuner proposes the family's fastest at the main shape with, for
every other shape, the settings that were fastest there, when they beat its own there by PER_SHAPE_MIN_GAIN. The
gate then times that candidate on every shape, so the per-shape choice is measured, not assumed. Tuning happens on
the run's GPU: a table found on one GPU model is for that model.

Everything is read with `ast` and `ast.literal_eval`; candidate code is never executed here. A rewrite replaces only
the value expressions of the constants' assignments, located by their AST positions, so comments, formatting and
every other byte of the source stay as they were. A broken declaration raises TuneError with a specific message;
the proposer turns it, like an exhausted neighbourhood, into a recorded Proposal failure and never raises.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import random
import re

from appliance import parsing
from appliance.proposers import surrogate
from appliance.proposers.base import Measured, PromptContext, Proposal, Traits
from appliance.proposers.edits import source_hash

DECLARATION = "TUNABLES"
PER_SHAPE = "TUNED_BY_SHAPE"
# A shape gets settings of its own only when they were this much faster there: times of different evaluations
# differ by a few percent anyway, and a table entry that wins by noise only adds code paths.
PER_SHAPE_MIN_GAIN = 1.03
LITERAL_TYPES = (bool, int, float, str)
MAX_ENUMERATED = 4096  # search spaces up to this size are enumerated for the random combinations; larger are sampled
MAX_DRAWS_PER_PROPOSAL = 50
# The share of proposals that are random settings of the whole space rather than one-step moves. On the H200 two
# tuner runs (rmsnorm, layernorm; 50 evaluations each) climbed into "one read per row" and stayed: the setting 2-3 %
# faster (two reads with L2 hints, wider blocks, more warps) was three moves away, each move alone slower.
EXPLORE_SHARE = 0.25
LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")  # the line breaks ast counts (not \f, \v or U+2028)


MAX_VALUES = 256  # per declared tunable: a longer list is a mistake (or an attack on the tuner's time), not a space


class TuneError(ValueError):
    """Why a source's tunables cannot be read or rewritten (short and specific: it is recorded with the run)."""


def read_tunables(source: str) -> dict[str, list]:
    """The declared tunables, name -> allowed values in order; {} when the source declares no TUNABLES."""
    tree = _parse(source)
    node = _declaration(tree)
    if node is None:
        return {}
    try:
        declared = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TuneError(f"{DECLARATION} (line {node.lineno}) must hold only literals, like "
                        f'{{"MAX_BLOCK": [1024, 2048]}}') from None
    constants = _constants(tree)
    tunables: dict[str, list] = {}
    for name, values in declared.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TuneError(f"{DECLARATION} key {name!r} is not a constant name")
        if not isinstance(values, (list, tuple)) or not values:
            raise TuneError(f"{DECLARATION}[{name!r}] must be a non-empty list of values")
        if len(values) > MAX_VALUES:
            raise TuneError(f"{DECLARATION}[{name!r}] lists {len(values)} values; at most {MAX_VALUES} per tunable")
        seen = set()
        for v in values:
            _check_literal(v, f"{DECLARATION}[{name!r}]")
            key = (isinstance(v, bool), isinstance(v, str), v)  # what _same compares, as a set key
            if key in seen:
                raise TuneError(f"{DECLARATION}[{name!r}] lists {v!r} twice")
            seen.add(key)
        _constant_node(constants, name)  # raises when the module has no single top-level literal for it
        tunables[name] = list(values)
    return tunables


def current_values(source: str) -> dict[str, object]:
    """The current literal value of each declared tunable constant."""
    tunables = read_tunables(source)
    constants = _constants(_parse(source))
    return {name: ast.literal_eval(_constant_node(constants, name).value) for name in tunables}


def with_values(source: str, values: dict[str, object]) -> str:
    """The source with each named top-level constant set to its new value; every other byte is unchanged. Names need
    a single top-level `NAME = <literal>` assignment but need not be declared in TUNABLES."""
    constants = _constants(_parse(source))
    spans = []
    for name, value in values.items():
        _check_literal(value, f"new value of {name}")
        spans.append((_constant_node(constants, name).value, repr(value)))
    return splice(source, spans)


def read_per_shape(source: str) -> dict[tuple[int, ...], dict[str, object]] | None:
    """The TUNED_BY_SHAPE table (input shape -> {tunable: value}); None when the source declares none."""
    constants = _constants(_parse(source))
    if PER_SHAPE not in constants:
        return None
    node = _table_node(constants)
    table = ast.literal_eval(node.value)
    tunables = read_tunables(source)
    for shape, settings in table.items():
        if not (isinstance(shape, tuple) and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)):
            raise TuneError(f"{PER_SHAPE} key {shape!r} (line {node.lineno}) is not a shape like (4096, 65536)")
        if not isinstance(settings, dict) or not all(isinstance(k, str) and k in tunables for k in settings):
            raise TuneError(f"{PER_SHAPE}[{shape!r}] must map declared tunables to values, like "
                            f'{{"MAX_BLOCK": 1024}}')
        for name, value in settings.items():
            _check_literal(value, f"{PER_SHAPE}[{shape!r}][{name!r}]")
    return table


def with_per_shape(source: str, table: dict[tuple[int, ...], dict[str, object]]) -> str:
    """The source with its TUNED_BY_SHAPE table replaced (shapes in order, one per line); every other byte unchanged."""
    node = _table_node(_constants(_parse(source)))
    if not table:
        return splice(source, [(node.value, "{}")])
    entries = "".join(f"    {shape!r}: {dict(sorted(settings.items()))!r},\n" for shape, settings in sorted(table.items()))
    return splice(source, [(node.value, "{\n" + entries + "}")])


def per_shape_proposal(parent: str, measured: list[Measured],
                       min_gain: float = PER_SHAPE_MIN_GAIN) -> tuple[str, str] | None:
    """(source, note): the fastest at the main shape of the parent's family (measured candidates that differ from it
    only in settings), with TUNED_BY_SHAPE giving each other shape the settings that were fastest there. None when
    the parent has no table or the evidence changes nothing."""
    mine = _family_settings(parent)
    if mine is None:
        return None
    members = [(m, _family_settings(m.source)) for m in measured if m.main_ms]
    members = [(m, found) for m, found in members if found is not None and found[0] == mine[0]]
    if len(members) < 2:
        return None
    base, (_, constants, table) = min(members, key=lambda member: member[0].main_ms)

    def setting_at(found: tuple, shape: tuple) -> dict:
        return found[1] | found[2].get(shape, {})

    def key(values: dict) -> tuple:  # repr: True and 1 are different settings
        return tuple((name, repr(v)) for name, v in sorted(values.items()))

    fastest: dict[tuple, dict[tuple, tuple[float, dict]]] = {}  # shape -> setting -> (best time seen, the setting)
    for m, found in members:
        for shape, ms in m.by_shape.items():
            values = setting_at(found, shape)
            times = fastest.setdefault(shape, {})
            if ms < times.get(key(values), (math.inf,))[0]:
                times[key(values)] = (ms, values)
    new_table, changes = dict(table), []
    for shape, times in sorted(fastest.items()):
        own = times.get(key(setting_at((None, constants, table), shape)))
        best_ms, best = min(times.values(), key=lambda t: t[0])
        if own is None or best_ms * min_gain >= own[0]:
            continue
        entry = {name: v for name, v in best.items() if not _same(v, constants[name])}
        if entry:
            new_table[shape] = entry
        else:
            new_table.pop(shape, None)
        change = ", ".join(f"{n} {v!r}" for n, v in entry.items()) or "the constants"
        changes.append(f"{shape}: {change} ({own[0]:.3g} -> {best_ms:.3g} ms)")
    if new_table == table:
        return None
    return with_per_shape(base.source, new_table), "per shape: " + "; ".join(changes)


def cached_proposal(parent: str, known: list[Measured], known_from: str) -> tuple[str, str] | None:
    """(source, note): the fastest member at the main shape, among earlier runs' candidates of the parent's family;
    None when there is none, or the parent is it."""
    family = _family(parent)
    members = [m for m in known if m.main_ms and family is not None and _family(m.source) == family]
    if not members:
        return None
    best = min(members, key=lambda m: m.main_ms)
    if source_hash(best.source) == source_hash(parent):
        return None
    try:
        mine, theirs = current_values(parent), current_values(best.source)
    except TuneError:
        return None
    changes = ", ".join(f"{k} {mine[k]!r}->{v!r}" for k, v in theirs.items() if not _same(v, mine.get(k))) or \
        "the same constants, its per-shape table"
    return best.source, f"cached: the fastest of {known_from or 'earlier runs'} ({best.main_ms:.3g} ms): {changes}"


def model_proposal(parent: str, tunables: dict[str, list], current: dict[str, object], measured: list[Measured],
                   taken: set[str]) -> tuple[str, str] | None:
    """(source, note): the parent with the settings a model of its family's main-shape times predicts fastest among
    those not yet proposed; None until the family has surrogate.MIN_POINTS timed members."""
    family = _family(parent)
    points = []
    for m in measured:
        if m.main_ms and family is not None and _family(m.source) == family:
            try:
                points.append((current_values(m.source), m.main_ms))
            except TuneError:
                continue
    model = surrogate.fit(points, tunables)
    if model is None:
        return None
    for settings, predicted in model.fastest(exclude={surrogate.key(s) for s, _ in points}, limit=8):
        changed = {name: v for name, v in settings.items() if not _same(v, current[name])}
        source = with_values(parent, changed) if changed else None
        if source is not None and source_hash(source) not in taken:
            return source, f"model ({len(points)} timed): {_note(changed, current, tunables)}, predicted {predicted:.3g} ms"
    return None


@functools.lru_cache(maxsize=4096)
def _family_settings(source: str) -> tuple[str, dict, dict] | None:
    """(family, constants, per-shape table) of a source with a TUNED_BY_SHAPE table, else None (or unreadable).
    Cached: a tuner asks this of every passing candidate of the run at each proposal. Callers must not change the
    dicts."""
    try:
        table = read_per_shape(source)
        return None if table is None else (_family(source), current_values(source), table)
    except TuneError:
        return None


def splice(source: str, spans: list[tuple[ast.expr, str]]) -> str:
    """The source with each expression node's text replaced; every other byte unchanged."""
    lines = LINE_RE.findall(source)
    starts = list(itertools.accumulate((len(line) for line in lines), initial=0))

    def offset(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return starts[lineno - 1] + len(lines[lineno - 1].encode("utf-8", "surrogatepass")[:col].decode("utf-8"))

    out = source
    for node, text in sorted(spans, key=lambda span: (span[0].lineno, span[0].col_offset), reverse=True):
        out = out[: offset(node.lineno, node.col_offset)] + text + out[offset(node.end_lineno, node.end_col_offset) :]
    return out


def _table_node(constants: dict[str, list[ast.stmt]]) -> ast.Assign | ast.AnnAssign:
    stmts = constants[PER_SHAPE]
    if len(stmts) > 1 or _simple_target(stmts[0]) != PER_SHAPE or not isinstance(stmts[0].value, ast.Dict):
        raise TuneError(f"{PER_SHAPE} (line {stmts[0].lineno}) must be assigned once, alone, a dict literal")
    try:
        ast.literal_eval(stmts[0].value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TuneError(f"{PER_SHAPE} (line {stmts[0].lineno}) must hold only literals") from None
    return stmts[0]


@functools.lru_cache(maxsize=4096)
def _family(source: str) -> str | None:
    """What a source is apart from its settings: candidates with the same family differ only in tunable values."""
    try:
        constants = _constants(_parse(source))
        spans = [(_constant_node(constants, name).value, "0") for name in read_tunables(source)]
        if PER_SHAPE in constants:
            spans.append((_table_node(constants).value, "{}"))
    except TuneError:
        return None
    return source_hash(splice(source, spans))


def neighbours(values: list, current: object) -> list:
    """The listed values one step before and after `current`; for a value not in the list, the nearest listed
    values on either side (numbers) or every listed value (anything else)."""
    index = next((i for i, v in enumerate(values) if _same(v, current)), None)
    if index is not None:
        return [values[i] for i in (index - 1, index + 1) if 0 <= i < len(values)]
    if _is_number(current) and all(_is_number(v) for v in values):
        below = [v for v in values if v < current]
        above = [v for v in values if v > current]
        return ([max(below)] if below else []) + ([min(above)] if above else [])
    return list(values)


class TuneProposer:
    """Coordinate moves first (one tunable one step from the parent's value, in a random order), then random
    combinations; never a source whose hash is in `seen` or was already proposed in the same batch."""

    name = "tune"
    # Its moves come from the declared tunables, whatever Nsight Compute says; settings of a kernel that built.
    traits = Traits(reads_profiles=False, avoids_seen=True, starts_on_pending_seed=True, needs_no_screen=True)

    def __init__(self, rng: random.Random, explore: float = EXPLORE_SHARE):
        self.rng, self.explore = rng, explore

    def accepts(self, parent_source: str) -> bool:
        return tunable(parent_source)

    def propose(self, ctx: PromptContext, n: int, seen: set[str] | None = None) -> list[Proposal]:
        if n <= 0:
            return []
        parent = original = ctx.parent.source
        found_note = ""
        try:
            if not read_tunables(parent) and (found := _discovered(parent)) is not None:
                # No declaration: the launch parameters found in its Triton launches, written back as tunables.
                parent, lifted = found
                found_note = "launch parameters found: " + ", ".join(f.constant for f in lifted) + "; "
            tunables = read_tunables(parent)
            current = current_values(parent)
        except TuneError as e:
            return [self._failure(f"bad_tunables: {e}", "bad_tunables")]
        if not tunables:
            declared = _declaration(parsing.parse(parent))
            why = ("its TUNABLES dict is empty" if declared else
                   "it declares no TUNABLES dict, and its Triton launches have no literal block size, num_warps "
                   "or num_stages to take as one")
            return [self._failure(f"no_tunables: the parent has nothing to tune: {why}", "no_tunables")]
        taken = set(seen or ()) | {source_hash(original), source_hash(parent)}
        proposals: list[Proposal] = []

        def offer(source: str, note: str) -> None:
            digest = source_hash(source)
            if digest not in taken:
                taken.add(digest)
                proposals.append(Proposal(source=source, proposer=self.name, mode="tune", note=found_note + note))

        # First, the fastest settings earlier runs of the task found on this GPU (the cache: no search again).
        if cached := cached_proposal(parent, ctx.known, ctx.known_from):
            offer(*cached)
        measured = ctx.measured + ctx.known  # (times from the same GPU model, driver and size mode)
        try:  # then whatever was measured per shape (a broken table only costs this step)
            if len(proposals) < n and (composed := per_shape_proposal(parent, measured)):
                offer(*composed)
        except TuneError:
            pass
        if len(proposals) < n and (modelled := model_proposal(parent, tunables, current, measured, taken)):
            offer(*modelled)  # then the setting a model of the family's timings predicts fastest (surrogate.py)
        # A share of the proposals jumps anywhere in the space: one-step moves alone get stuck where the better
        # setting is several moves away and each move alone is slower (measured: rmsnorm, docs in EXPLORE_SHARE).
        rng = ctx.rng or self.rng
        jumps = sum(rng.random() < self.explore for _ in range(n)) if self.explore else 0
        jumps = min(jumps, n - len(proposals))  # never more than asked: the loop sized the generation to its budget
        wanted = len(proposals) + jumps
        for values in itertools.islice(self._combinations(tunables, current, jumps, rng), jumps * MAX_DRAWS_PER_PROPOSAL):
            if len(proposals) >= wanted:
                break
            offer(with_values(parent, values), _note(values, current, tunables))
        moves = [(name, v) for name, values in tunables.items() for v in neighbours(values, current[name])]
        rng.shuffle(moves)
        for name, value in moves:
            if len(proposals) >= n:
                return proposals
            offer(with_values(parent, {name: value}), _note({name: value}, current, tunables))
        for values in self._combinations(tunables, current, n - len(proposals), rng):
            if len(proposals) >= n:
                break
            offer(with_values(parent, values), _note(values, current, tunables))
        if proposals:
            return proposals
        return [self._failure(f"tune_exhausted: {_exhausted_text(tunables, len(moves), n)} of "
                              f"{', '.join(tunables)} has been evaluated already", "exhausted")]

    def _combinations(self, tunables: dict[str, list], current: dict[str, object], wanted: int, rng: random.Random):
        """Settings that change at least one tunable: all of them in a random order when the space is small,
        otherwise a bounded number of random draws."""
        names = list(tunables)
        size = math.prod(len(v) for v in tunables.values())
        if size <= MAX_ENUMERATED:
            combos = list(itertools.product(*tunables.values()))
            rng.shuffle(combos)
        else:
            draws = max(wanted, 1) * MAX_DRAWS_PER_PROPOSAL
            combos = (tuple(rng.choice(tunables[name]) for name in names) for _ in range(draws))
        for combo in combos:
            changed = {name: v for name, v in zip(names, combo) if not _same(v, current[name])}
            if changed:
                yield changed

    def _failure(self, why: str, kind: str) -> Proposal:
        return Proposal(source=None, proposer=self.name, failure=why, mode="tune", kind=kind)


def tunable(source: str) -> bool:
    """Whether the tuner has something to move: declared TUNABLES, or launch parameters it can find (discover.py)."""
    try:
        return bool(read_tunables(source)) or _discovered(source) is not None
    except TuneError:
        return False


@functools.lru_cache(maxsize=256)
def _discovered(source: str):
    """discover.discover(source), cached: the loop asks `accepts` of the same parents at every slot."""
    from appliance.proposers.discover import discover  # (it builds on this module's splice)

    return discover(source)


def _parse(source: str) -> ast.Module:
    try:
        return parsing.parse(source)
    except SyntaxError as e:
        raise TuneError(f"source does not parse: line {e.lineno}: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise TuneError(f"source does not parse: {type(e).__name__}: {e}"[:200]) from None


def _assigned_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    else:
        return []
    names = []
    for target in targets:
        names += [t.id for t in ast.walk(target) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)]
    return names


def _declaration(tree: ast.Module) -> ast.Dict | None:
    stmts = [s for s in tree.body if DECLARATION in _assigned_names(s)]
    if not stmts:
        return None
    if len(stmts) > 1:
        raise TuneError(f"{DECLARATION} is assigned {len(stmts)} times at top level (lines "
                        f"{', '.join(str(s.lineno) for s in stmts)}); declare it once")
    stmt = stmts[0]
    simple = _simple_target(stmt)
    if simple != DECLARATION or not isinstance(stmt.value, ast.Dict):
        raise TuneError(f"{DECLARATION} (line {stmt.lineno}) must be assigned alone a dict literal, like "
                        f'TUNABLES = {{"MAX_BLOCK": [1024, 2048]}}')
    return stmt.value


def _simple_target(stmt: ast.stmt) -> str | None:
    """NAME for `NAME = value` or `NAME: T = value`; None for anything else (chained, unpacking, augmented)."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return stmt.target.id
    return None


def _constants(tree: ast.Module) -> dict[str, list[ast.stmt]]:
    """Every top-level statement that assigns each name."""
    found: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        for name in _assigned_names(stmt):
            found.setdefault(name, []).append(stmt)
    return found


def _constant_node(constants: dict[str, list[ast.stmt]], name: str) -> ast.Assign | ast.AnnAssign:
    stmts = constants.get(name, [])
    if not stmts:
        raise TuneError(f"{name} has no top-level `{name} = <literal>` assignment to rewrite")
    if len(stmts) > 1:
        raise TuneError(f"{name} is assigned {len(stmts)} times at top level (lines "
                        f"{', '.join(str(s.lineno) for s in stmts)}); assign it once")
    stmt = stmts[0]
    if _simple_target(stmt) != name:
        raise TuneError(f"{name} (line {stmt.lineno}) must be assigned alone, as `{name} = <literal>`")
    try:
        value = ast.literal_eval(stmt.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TuneError(f"{name} (line {stmt.lineno}) is not assigned a literal") from None
    _check_literal(value, name)
    return stmt


def _check_literal(value: object, where: str) -> None:
    if not isinstance(value, LITERAL_TYPES):
        raise TuneError(f"{where}: {value!r} is a {type(value).__name__}; use ints, floats, bools or strings")
    if isinstance(value, float) and not math.isfinite(value):
        raise TuneError(f"{where}: {value!r} is not a finite number")


def _same(a: object, b: object) -> bool:
    """Equal and of the same kind: True is not 1, and 4 is not "4"; 4 and 4.0 are the same number."""
    return isinstance(a, bool) == isinstance(b, bool) and isinstance(a, str) == isinstance(b, str) and a == b


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _note(values: dict[str, object], current: dict[str, object], tunables: dict[str, list]) -> str:
    note = ", ".join(f"{name} {current[name]!r}->{v!r}" for name, v in values.items())
    off = [name for name in values if not any(_same(current[name], v) for v in tunables[name])]
    return note + (f" (parent's {', '.join(off)} not in TUNABLES)" if off else "")


def _exhausted_text(tunables: dict[str, list], moves: int, n: int) -> str:
    size = math.prod(len(v) for v in tunables.values())
    if size <= MAX_ENUMERATED:
        return f"every one-step move ({moves}) and every other combination ({size - 1})"
    return f"every one-step move ({moves}) and all {n * MAX_DRAWS_PER_PROPOSAL} random combinations drawn"
