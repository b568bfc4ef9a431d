"""Checks of a candidate's text that need nothing prepared and nothing run: a candidate that cannot work gets its
verdict in well under a second, before the task's inputs are drawn and its baselines timed. Read with `ast`
only (the candidate's code is never executed here); anything this cannot judge is left to the jailed evaluation,
which would reach the same verdict, only later."""

from __future__ import annotations

import ast

from appliance import parsing
from appliance.evaluation.verdicts import Rejection


MAX_PARSED_BYTES = 256 << 10  # a larger source is left to the jail: ast's tree of megabytes costs gigabytes here


def static_rejection(source: str, task_source: str) -> Rejection | None:
    """load_error for a syntax error, a module without ModelNew, or a ModelNew whose constructor or forward cannot
    take what the task's get_init_inputs() and get_inputs() give its Model."""
    if len(source) > MAX_PARSED_BYTES or len(task_source) > MAX_PARSED_BYTES:
        return None
    try:
        tree = parsing.parse(source)
    except SyntaxError as e:
        where = f"line {e.lineno}" + (f", column {e.offset}" if e.offset else "")
        return _load_error(f"syntax error at {where}: {e.msg}")
    except (ValueError, RecursionError, MemoryError):  # nested too deep for the parser here: the jail decides
        return None
    defined = _top_level_names(tree)
    if "ModelNew" not in defined:
        return _load_error("no class ModelNew: the candidate must define one (an nn.Module taking what the task's "
                           "Model takes, in its constructor and its forward)")
    new = _class(tree, "ModelNew")
    try:
        model = _class(parsing.parse(task_source), "Model")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        model = None
    if new is None or model is None or _reshaped(new):
        return None  # ModelNew made another way (an assignment, an import, a decorator): the jail sees what it is
    for method, gives in (("__init__", "get_init_inputs()"), ("forward", "get_inputs()")):
        theirs, ours = _arity(new, method), _arity(model, method)
        if theirs is None or ours is None or ours[0] != ours[1]:
            continue  # not defined here (inherited), or the Model itself takes a variable number
        low, high = theirs
        if (low, high) == (1, 0):
            return _load_error(f"ModelNew.{method} has a keyword-only argument without a default; the gate passes "
                               f"what {gives} gives positionally")
        if not low <= ours[0] <= high:
            takes = f"{low}" if low == high else f"{low} to {'any number' if high == float('inf') else high}"
            return _load_error(f"ModelNew.{method} takes {takes} argument(s) besides self; the task's Model takes "
                               f"{ours[0]}, as {gives} gives them")
    return None


def _load_error(reason: str) -> Rejection:
    return Rejection("load_error", "load", reason, "static")


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if _dynamic(node) or not all(isinstance(t, (ast.Name, ast.Tuple, ast.List)) for t in targets):
                names.add("ModelNew")  # globals()["ModelNew"] = ..., module.__dict__[...] = ...
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            if any(a.name == "*" for a in node.names):
                names.add("ModelNew")  # from m import *: may be among them
        elif not isinstance(node, (ast.Expr, ast.Pass)) or _dynamic(node):
            # under a condition, a loop, a match, a with; globals()[...] =, a walrus, setattr(...): undecidable here
            names.add("ModelNew")
    if "__getattr__" in names:  # a module __getattr__ can answer for ModelNew
        names.add("ModelNew")
    return names


def _dynamic(node: ast.stmt) -> bool:
    """An expression statement that may bind names: a walrus, globals()/setattr/exec calls."""
    for n in ast.walk(node):
        if isinstance(n, ast.NamedExpr):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("globals", "setattr", "exec",
                                                                                      "vars", "locals"):
            return True
        if isinstance(n, ast.Attribute) and n.attr in ("__dict__", "update"):
            return True
    return False


def _reshaped(cls: ast.ClassDef) -> bool:
    """A class whose call may not be its methods' signatures: decorated, a metaclass, __call__ or __new__ of its
    own, or forward/__init__ bound by assignment."""
    if cls.decorator_list or cls.keywords:
        return True
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("__call__", "__new__"):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in ("forward", "__init__", "__call__") for t in targets):
                return True
    return False


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return found[-1] if found else None


def _arity(cls: ast.ClassDef, method: str) -> tuple[int, float] | None:
    """(least, most) positional arguments the method takes besides self; None if the class does not define it
    (or wraps it in a decorator, which may change what it takes)."""
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method]
    if not found or found[-1].decorator_list:
        return None
    a = found[-1].args
    positional = a.posonlyargs + a.args
    required = len(positional) - len(a.defaults)
    if a.kwonlyargs and any(d is None for d in a.kw_defaults):
        return (1, 0)  # a keyword-only argument without a default: no call the gate makes (positional) fills it
    most = float("inf") if a.vararg else len(positional) - 1
    return (max(required - 1, 0), most)
