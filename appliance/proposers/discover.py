"""Tunables found in a Triton candidate that declares none, written back into its source.

An LLM (or a person) writes `kernel[grid](x, y, n, BLOCK_SIZE=1024, num_warps=4)` and declares no TUNABLES; the
tuner (tune.py) moves only declared constants. This module reads every launch `K[grid](...)` of a module-level
`@triton.jit` function K and lifts its launch parameters into module-level constants with a TUNABLES declaration:

- a keyword argument that is a constexpr parameter of K named like a block size (BLOCK, TILE, GROUP_SIZE in its
  name) and given a power-of-two int literal: values from a quarter to four times it;
- `num_warps` (1 to 32 warps) and `num_stages` (1 to 5), given as a literal or not given at all (then Triton's
  defaults, 4 and 3, are written out: they change how the kernel runs, not what it computes);
- such a keyword given a module-level constant that is assigned an int literal: that constant is declared as is.

Block sizes computed at run time (`triton.next_power_of_2(n)`) are left alone: they often must cover a whole row.
Another value of a block size may still be wrong or fail to build for some kernel; the gate decides, as for every
candidate. Everything is read with `ast` and rewritten by AST positions: no candidate code runs here, and every
other byte of the source stays as it was. A source that already declares TUNABLES is the author's choice and is
not touched.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from appliance import parsing
from appliance.proposers.tune import DECLARATION, splice

BLOCK_NAME = re.compile(r"BLOCK|TILE|GROUP_SIZE", re.IGNORECASE)
WARPS = [1, 2, 4, 8, 16, 32]
STAGES = [1, 2, 3, 4, 5]
TRITON_DEFAULTS = {"num_warps": 4, "num_stages": 3}  # what a launch without them gets on a CUDA GPU
MAX_BLOCK = 1 << 16


@dataclass(frozen=True)
class Found:
    """One launch parameter lifted into a constant."""

    constant: str
    kernel: str
    keyword: str
    value: int
    values: tuple[int, ...]


class _At:
    """A zero-width place in the source, for splice() to insert at."""

    def __init__(self, lineno: int, col: int):
        self.lineno = self.end_lineno = lineno
        self.col_offset = self.end_col_offset = col


def discover(source: str) -> tuple[str, list[Found]] | None:
    """(the source with its launch parameters as declared tunables, what was lifted), or None when it declares
    TUNABLES already, cannot be parsed, or has nothing to lift. The source is untrusted: whatever it holds, the
    answer is one of those, never an exception."""
    try:
        return _discover(parsing.parse(source), source)
    except (SyntaxError, ValueError, TypeError, IndexError, MemoryError, RecursionError):
        return None


def _discover(tree: ast.Module, source: str) -> tuple[str, list[Found]] | None:
    top = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
           for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    if DECLARATION in top:
        return None
    # Kernels under triton.autotune or triton.heuristics choose their own launch parameters: left alone.
    kernels = {node.name: _constexprs(node) for node in tree.body if isinstance(node, ast.FunctionDef)
               and any(_is_triton_jit(d) for d in node.decorator_list)
               and not any(ast.unparse(d).startswith(("triton.autotune", "triton.heuristics", "autotune",
                                                      "heuristics")) for d in node.decorator_list)}
    literals = _int_constants(tree)
    found: dict[str, Found] = {}
    declared: dict[str, tuple[int, ...]] = {}  # module constants a launch already reads
    spans: list[tuple[object, str]] = []
    # Every identifier-like word is taken (parameters, functions, classes, imports, attributes, words in strings):
    # a new constant may only shadow nothing.
    taken = set(top) | set(re.findall(r"[A-Za-z_]\w*", source))
    starts = _offsets(source)  # once: the launches' insertions all need line offsets
    for call in ast.walk(tree):
        kernel = _launched_kernel(call, kernels)
        if kernel is None:
            continue
        given = {k.arg: k for k in call.keywords if k.arg}
        for keyword, node in given.items():
            values_of = _values_for(keyword, kernels[kernel])
            if values_of is None:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in literals:
                name = node.value.id
                declared.setdefault(name, values_of(literals[name]) or ())
                continue
            value = _int_literal(node.value)
            values = values_of(value) if value is not None else None
            if not values or _also_elsewhere(call, node, value):
                continue  # (a block size the grid also spells out: changing one alone would break the launch)
            lifted = _lift(found, taken, kernel, keyword, value, values)
            spans.append((node.value, lifted.constant))
        missing = []
        for keyword, default in TRITON_DEFAULTS.items():
            if keyword in given or any(k.arg is None for k in call.keywords):  # (**kwargs may carry it)
                continue
            lifted = _lift(found, taken, kernel, keyword, default, _values_for(keyword, set())(default))
            missing.append(f"{keyword}={lifted.constant}")
        if missing:
            spans.append((_At(*_before_close(source, call)), _keyword_text(source, starts, call, ", ".join(missing))))
    declared = {name: values for name, values in declared.items() if values}
    if not found and not declared:
        return None
    lines = [f"{f.constant} = {f.value}  # {f.kernel}: {f.keyword}" for f in found.values()]
    entries = {f.constant: list(f.values) for f in found.values()} | {n: list(v) for n, v in declared.items()}
    lines.append(f"{DECLARATION} = {entries!r}")
    header = ("\n# Launch parameters found by the tuner (appliance/proposers/discover.py); it rewrites these.\n"
              + "\n".join(lines) + "\n")
    spans.append((_At(*_after_imports(source, tree)), header))
    rewritten = splice(source, spans)
    from appliance.proposers.tune import TuneError, current_values, read_tunables

    try:
        parsing.parse(rewritten)
        if not read_tunables(rewritten) or set(current_values(rewritten)) != set(entries):
            return None
    except (SyntaxError, ValueError, TuneError, MemoryError, RecursionError):
        return None  # a launch written in a way the insertion did not foresee: leave the source as it was
    return rewritten, list(found.values()) + [Found(n, "", "module constant", 0, v) for n, v in declared.items()]


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("triton.jit", "jit")


def _constexprs(fn: ast.FunctionDef) -> set[str]:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return {a.arg for a in args if a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr")}


def _int_constants(tree: ast.Module) -> dict[str, int]:
    """Module-level NAME = <int literal>, assigned once."""
    seen: dict[str, list[ast.expr]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            seen.setdefault(node.targets[0].id, []).append(node.value)
    return {name: value for name, nodes in seen.items() if len(nodes) == 1
            and (value := _int_literal(nodes[0])) is not None}


def _int_literal(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _launched_kernel(node: ast.AST, kernels: dict[str, set[str]]) -> str | None:
    """K for a call `K[grid](...)` of a module-level Triton kernel K."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in kernels):
        return node.func.value.id
    return None


def _values_for(keyword: str, constexprs: set[str]):
    """The values to try for a launch keyword, as a function of its current value; None when it is not tunable."""
    if keyword == "num_warps":
        return lambda v: WARPS if v in WARPS else None
    if keyword == "num_stages":
        return lambda v: STAGES if v in STAGES else None
    if keyword in constexprs and BLOCK_NAME.search(keyword):
        return lambda v: (tuple(b for b in (v // 4, v // 2, v, v * 2, v * 4) if 1 <= b <= MAX_BLOCK)
                          if v > 0 and v & (v - 1) == 0 else None)
    return None


def _lift(found: dict[str, Found], taken: set[str], kernel: str, keyword: str, value: int,
          values) -> Found:
    """The constant for (kernel, keyword, value): launches of a kernel that gave it the same value share it, and
    one that gave another value (a block size can be part of what a launch computes) gets its own."""
    for f in found.values():
        if (f.kernel, f.keyword, f.value) == (kernel, keyword, value):
            return f
    base = re.sub(r"\W", "_", f"{keyword}_{kernel}".upper())
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    found[name] = Found(name, kernel, keyword, value, tuple(values))
    return found[name]


def _offsets(source: str) -> list[int]:
    from appliance.proposers.tune import LINE_RE

    starts = [0]
    for line in LINE_RE.findall(source):
        starts.append(starts[-1] + len(line))
    return starts


def _before_close(source: str, call: ast.Call) -> tuple[int, int]:
    """(line, column) of the call's closing parenthesis."""
    return call.end_lineno, call.end_col_offset - 1


def _also_elsewhere(call: ast.Call, keyword: ast.keyword, value: int) -> bool:
    """Whether the literal `value` of `keyword` also appears elsewhere in the launch (its grid, another argument)."""
    return any(isinstance(n, ast.Constant) and type(n.value) is int and n.value == value and n is not keyword.value
               for n in ast.walk(call))


def _keyword_text(source: str, starts: list[int], call: ast.Call, keywords: str) -> str:
    """`, num_warps=NUM_WARPS_K` to insert before the call's `)`; no comma after a trailing one or none after `(`."""
    line = source[starts[call.end_lineno - 1]:starts[call.end_lineno]]
    col = len(line.encode("utf-8", "surrogatepass")[:call.end_col_offset - 1].decode("utf-8"))
    before = (source[:starts[call.end_lineno - 1]] + line[:col]).rstrip()
    if before.endswith((",", "(")):
        return f" {keywords}" if before.endswith(",") else keywords
    return f", {keywords}"


def _after_imports(source: str, tree: ast.Module) -> tuple[int, int]:
    """Where the constants go: at the start of the line after the last top-level import (or at the top)."""
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    line = imports[-1].end_lineno + 1 if imports else 1
    return (line, 0) if line <= len(_offsets(source)) - 1 else (1, 0)  # (an import on the last line: at the top)
