"""Tasks: a KernelBench problem file plus an optional TOML manifest beside it (format: benchmarks/README.md).

Everything here is static: the task's code is parsed, never run, in the controller's process. Running it
(get_inputs raising, shapes that break the model) happens in the reference harness, whose errors come back
with the task's file and line.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import io
import re
import threading
import tokenize
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from appliance import parsing
from appliance.errors import TaskError

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
BACKENDS = ("triton", "cuda", "cupy")
MODES = ("small", "full")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Distribution(_Strict):
    kind: Literal["default", "uniform", "randn", "scaled", "outliers", "nonfinite"] = "default"
    scale: float = 100.0
    fraction: float = Field(0.001, gt=0, le=1)


class Tolerance(_Strict):
    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


class ShapeSpec(_Strict):
    name: str
    sizes: dict[str, int] = {}
    distribution: Distribution | None = None
    layout: Literal["contiguous", "strided", "padded"] = "contiguous"
    modes: list[Literal["small", "full"]] = list(MODES)

    @field_validator("distribution", mode="before")
    @classmethod
    def _dist(cls, v: Any) -> Any:
        return {"kind": v} if isinstance(v, str) else v


class SmallMode(_Strict):
    sizes: dict[str, int] = {}


class Manifest(_Strict):
    description: str = ""
    dtype: Literal["float64", "float32", "float16", "bfloat16"] | None = None
    seeds: int = Field(3, ge=1, le=64)
    distribution: Distribution = Distribution()
    backends: list[Literal["triton", "cuda", "cupy"]] = list(BACKENDS)
    flops: str | None = None
    bytes: str | None = None
    tolerance: dict[str, Tolerance] = {}
    small: SmallMode = SmallMode()
    shapes: list[ShapeSpec] = []

    @field_validator("distribution", mode="before")
    @classmethod
    def _dist(cls, v: Any) -> Any:
        return {"kind": v} if isinstance(v, str) else v

    @field_validator("tolerance")
    @classmethod
    def _tol_keys(cls, v: dict[str, Tolerance]) -> dict[str, Tolerance]:
        unknown = set(v) - set(FLOAT_DTYPES)
        if unknown:
            raise ValueError(f"unknown dtype(s) {sorted(unknown)}; use {', '.join(FLOAT_DTYPES)}")
        return v


@dataclass(frozen=True)
class Shape:
    """One concrete shape to check and time: module-level size overrides plus input settings, and where it came
    from. A derived shape (no manifest) is checked for correctness only, never timed."""

    name: str
    sizes: dict[str, Any]  # ints, or tuples of ints
    distribution: dict[str, Any]
    layout: str
    origin: str = "the task file's sizes"
    timed: bool = True

    def describe(self) -> str:
        """One line for people and prompts: name, sizes, inputs, layout, where it came from. A derived shape's
        sizes are drawn in secret by each worker (secret_draw): those shown are the rule's, as an example."""
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items()) or "no sizes"
        if self.origin.startswith("derived"):
            sizes = f"sizes drawn in secret for each run, near {sizes}"
        return (f"{self.name}: {sizes}; inputs {self.distribution.get('kind', 'default')}, {self.layout}; "
                f"{self.origin}{'' if self.timed else ' (correctness only)'}")


DERIVED_FROM = 16  # module-level ints below this are kept as they are: mostly axes, kernel sizes, strides, counts,
# whose change would change the problem rather than its shape


Draw = Callable[[str, int, int], int]  # (rule, size, span) -> an offset in [0, span)


def secret_draw(secret: bytes | None) -> Draw | None:
    """Offsets for the derived sizes from a secret the candidate never sees (each evaluation worker draws its own):
    a kernel cannot recognise the sizes it will be checked at and be wrong only elsewhere. One offset per (rule,
    size), so sizes equal in the file stay equal. None: the sizes the rules name, without offsets (what a prompt
    shows as an example)."""
    if secret is None:
        return None

    def draw(rule: str, n: int, span: int) -> int:
        digest = hmac.new(secret, f"{rule}:{n}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "little") % max(1, span)
    return draw


def odd_size(n: int, draw: Draw | None = None) -> int:
    """An odd value above n by up to an eighth (no odd value above 1 is a power of two): a kernel that assumes a
    multiple of its block, or a power of two, meets a size that is neither; one whose block or grid was fitted to the
    file's size (one block holds a row of exactly n) meets a size past it; and a kernel that drops the tail past its
    last whole block drops a large one (without a draw, n + p - 1, p a power of two: one short of a whole block of any
    size <= p, and the largest a draw gives; with one, any odd value in n + 1 .. n + p, secret)."""
    if n < DERIVED_FROM:
        return n
    p = 1 << (max(2, n // 8).bit_length() - 1)  # the largest power of two <= n / 8
    if draw is None:
        return (n + p - 1) | 1
    return (n + 1 + 2 * draw("odd", n, p // 2)) | 1


def smaller_size(n: int, draw: Draw | None = None) -> int:
    """An odd value near a quarter of n (a secret one up to a sixteenth of n above it): another size altogether,
    cheap to check."""
    if n < DERIVED_FROM:
        return n
    return (n // 4 + (draw("smaller", n, n // 16) if draw else 0)) | 1


ALIGNMENTS = (16, 32, 64, 128)  # an aligned size is one of these times an odd number (which one: drawn, secret)


def aligned_size(n: int, draw: Draw | None = None) -> int:
    """16 times an odd number near a quarter of n; with a draw, 16, 32, 64 or 128 times an odd number, near a quarter
    of n or up to a sixteenth above it, all secret: even and not a power of two. A kernel that takes a multiple of 16
    for a multiple of its block (and drops the tail past its last whole block) drops up to a block's worth here,
    and one with a fast path for multiples of 32 (or 64, 128) cannot tell when it is checked."""
    if n < DERIVED_FROM:
        return n
    if draw is None:
        return 16 * ((n // 64) | 1)
    fits = [a for a in ALIGNMENTS if a == 16 or 3 * a <= n // 4]  # (an odd factor of 3 or more: no power of two)
    a = fits[draw("alignment", n, len(fits))]
    return a * ((max(n // 4, a) // a + draw("aligned", n, max(1, n // (16 * a)))) | 1)


def _each_int(value, change):
    """A size with `change` applied to it, or to each int of a tuple of sizes (`input_shape = (32768,)`)."""
    return tuple(change(v) for v in value) if isinstance(value, (tuple, list)) else change(value)


def derived_shapes(sizes: dict[str, Any], distribution: dict[str, Any], secret: bytes | None = None) -> list[Shape]:
    """What a bare KernelBench file (no manifest) is checked at beside its own sizes, derived from its module-level
    integer sizes, with offsets drawn from `secret` (secret_draw). Each size maps by its value alone, so sizes that
    are equal in the file stay equal (a square matmul's M and K, a width shared by two inputs). The reference runs
    each first; a shape it cannot run is dropped and listed with the reason (sandbox/harness/referee.py)."""
    draw = secret_draw(secret)
    odd = {k: _each_int(v, lambda n: odd_size(n, draw)) for k, v in sizes.items()}
    small = {k: _each_int(v, lambda n: smaller_size(n, draw)) for k, v in sizes.items()}
    aligned = {k: _each_int(v, lambda n: aligned_size(n, draw)) for k, v in sizes.items()}
    extra = {"scale": 100.0, "fraction": 0.001}

    def shape(name, sz, dist, layout, origin):
        return Shape(name, sz, dist or distribution, layout, f"derived: {origin}", timed=False)

    return [shape("odd", odd, None, "contiguous", "every size made odd, up to an eighth above the file's (not a "
                  "multiple of a block, nor a power of 2)"),
            # x100 and shifted off zero, +4 standard deviations under even seeds and -4 under odd ones: rows all
            # positive or all negative (a min or max whose masked lanes read 0 is wrong on them; zero-mean hides it)
            shape("smaller_scaled", small, {"kind": "scaled", **extra, "shift": 4.0}, "contiguous",
                  "every size near a quarter, odd; inputs x100, shifted +-4 standard deviations off zero"),
            shape("strided_outliers", small, {"kind": "outliers", **extra}, "strided", "the smaller sizes, inputs as "
                  "stride-2 views with rows further apart than that, 0.1% of their values x100"),
            shape("nonfinite", small, {"kind": "nonfinite", **extra}, "contiguous", "the smaller sizes, 0.1% of the "
                  "inputs +inf, -inf or NaN (where the reference's output is defined, the candidate's must match it)"),
            shape("aligned_padded", aligned, None, "padded", "every size 16 x an odd number near a quarter (even, "
                  "not a power of 2); inputs as the rows of a wider buffer: inner stride 1, rows 16 elements further "
                  "apart than their width")]


@dataclass
class Task:
    path: Path
    source: str
    sizes: dict[str, Any]  # the module-level integer sizes (and tuples of them) as written in the file
    manifest: Manifest = field(default_factory=Manifest)
    manifest_path: Path | None = None
    manifest_text: str = ""

    @property
    def name(self) -> str:
        return self.path.stem

    def shapes(self, mode: str, secret: bytes | None = None) -> list[Shape]:
        """The main shape first, then every extra shape that belongs to this size mode (a bare file's derived
        sizes drawn with `secret`: derived_shapes)."""
        m = self.manifest
        main_sizes = dict(self.sizes) | (m.small.sizes if mode == "small" else {})
        shapes = [Shape("main", main_sizes, m.distribution.model_dump(), "contiguous")]
        if self.manifest_path is None:  # a bare KernelBench file: a manifest's shapes override these
            return shapes + derived_shapes(main_sizes, m.distribution.model_dump(), secret)
        for s in m.shapes:
            if mode in s.modes:
                dist = (s.distribution or m.distribution).model_dump()
                shapes.append(Shape(s.name, dict(self.sizes) | s.sizes, dist, s.layout, "the manifest"))
        return shapes

    def tolerances(self) -> dict[str, dict[str, float]]:
        """The manifest's explicit tolerances, by dtype. Every other floating dtype is checked against a bound tied
        to the precision the task's own Model reaches (sandbox/harness/compare.py)."""
        return {k: t.model_dump() for k, t in self.manifest.tolerance.items()}

    def work(self, sizes: dict[str, int]) -> tuple[float | None, float | None]:
        """FLOPs and bytes per call at these sizes, from the manifest's expressions."""
        where = str(self.manifest_path)
        flops = _eval_size_expr(self.manifest.flops, sizes, where) if self.manifest.flops else None
        nbytes = _eval_size_expr(self.manifest.bytes, sizes, where) if self.manifest.bytes else None
        return flops, nbytes


def task_files(task: Task) -> dict:
    """A task as text, to send to a worker process or Ray actor that rebuilds it on its side."""
    return {"name": task.name, "source": task.source, "manifest": task.manifest_text, "path": str(task.path)}


def reference_seed(task: Task) -> str:
    """The task's own module with `Model` renamed `ModelNew`: where an LLM run starts when there is no kernel yet."""
    lines = task.source.splitlines(keepends=True)
    names = [t.start for t in tokenize.generate_tokens(io.StringIO(task.source).readline)
             if t.type == tokenize.NAME and t.string == "Model"]
    for row, col in reversed(names):  # right to left: earlier columns stay valid
        line = lines[row - 1]
        lines[row - 1] = line[:col] + "ModelNew" + line[col + len("Model"):]
    header = (f"# Starting point: the reference of task {task.name!r} as ModelNew. It calls library ops, so the gate\n"
              "# rejects it as a library fallback: replace them with kernels of your own.\n")
    return header + "".join(lines)


class RebuiltTasks:
    """Tasks received as text (task_files), each written once under `root` and loaded: a worker's copies."""

    def __init__(self, root: Path):
        self.root, self.tasks, self.lock = root, {}, threading.Lock()

    def get(self, files: dict) -> Task:
        key = hashlib.sha256((files["name"] + files["source"] + files["manifest"]).encode()).hexdigest()[:16]
        with self.lock:
            if key not in self.tasks:
                d = self.root / key
                d.mkdir(parents=True, exist_ok=True)
                (d / f"{files['name']}.py").write_text(files["source"])
                if files["manifest"]:
                    (d / f"{files['name']}.toml").write_text(files["manifest"])
                self.tasks[key] = load_task(d / f"{files['name']}.py")
            return self.tasks[key]


def load_task(path: str | Path) -> Task:
    path = Path(path)
    if not path.is_file():
        raise TaskError(str(path), "no such task file")
    source = path.read_text()
    tree = _parse(source, str(path))
    _check_structure(tree, str(path))
    sizes = _module_sizes(tree)
    task = Task(path=path.resolve(), source=source, sizes=sizes)
    manifest_path = path.with_suffix(".toml")
    if manifest_path.is_file():
        task.manifest_text = manifest_path.read_text()
        task.manifest = _load_manifest(manifest_path, task.manifest_text, sizes)
        task.manifest_path = manifest_path.resolve()
    return task


def _parse(source: str, where: str) -> ast.Module:
    try:
        return parsing.parse(source, filename=where)
    except SyntaxError as e:
        raise TaskError(where, f"syntax error: {e.msg}", e.lineno) from None


def _check_structure(tree: ast.Module, where: str) -> None:
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    model = defs.get("Model")
    if not isinstance(model, ast.ClassDef):
        raise TaskError(where, "no `class Model(nn.Module)` at module level (KernelBench task format)")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in model.body):
        raise TaskError(where, "class Model has no forward() method", model.lineno)
    for fn in ("get_inputs", "get_init_inputs"):
        node = defs.get(fn)
        if not isinstance(node, ast.FunctionDef):
            raise TaskError(where, f"no `def {fn}()` at module level (KernelBench task format)")
        a = node.args
        required = len(a.posonlyargs) + len(a.args) - len(a.defaults)
        required += sum(d is None for d in a.kw_defaults)
        if required:
            raise TaskError(where, f"{fn}() must take no required arguments", node.lineno)


def _module_sizes(tree: ast.Module) -> dict[str, Any]:
    """Module-level integer constants: `dim = 4096`, and `batch_size, dim = 64, 512` alike; and tuples of them
    (KernelBench's `input_shape = (32768,)`), which derived shapes change with the ints they match."""
    sizes = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], node.value
        pairs = ([(target, value)] if isinstance(target, ast.Name) else
                 list(zip(target.elts, value.elts)) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                 and len(target.elts) == len(value.elts) else [])
        for name, constant in pairs:
            if not isinstance(name, ast.Name):
                continue
            if isinstance(constant, ast.Constant) and type(constant.value) is int:
                sizes[name.id] = constant.value
            elif (isinstance(constant, ast.Tuple) and constant.elts and
                  all(isinstance(e, ast.Constant) and type(e.value) is int for e in constant.elts)):
                sizes[name.id] = tuple(e.value for e in constant.elts)
    return sizes


def _load_manifest(path: Path, text: str, sizes: dict[str, int]) -> Manifest:
    where = str(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # Python 3.11's error has no lineno attribute, only "(at line N, column M)" in its message.
        found = re.search(r"at line (\d+)", str(e))
        line = getattr(e, "lineno", None) or (int(found.group(1)) if found else None)
        raise TaskError(where, f"invalid TOML: {e}", line) from None
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise TaskError(where, f"{key}: {err['msg']}", _line_of(text, err["loc"])) from None
    named = [("small.sizes", manifest.small.sizes)] + [(f"shapes[{s.name}].sizes", s.sizes) for s in manifest.shapes]
    for label, overrides in named:
        unknown = set(overrides) - set(sizes)
        if unknown:
            raise TaskError(
                where,
                f"{label}: {sorted(unknown)} are not module-level integer sizes of the task "
                f"(known: {sorted(sizes) or 'none'})",
                _line_of(text, [sorted(unknown)[0]]),
            )
    names = [s.name for s in manifest.shapes]
    if "main" in names or len(set(names)) != len(names):
        raise TaskError(where, "shape names must be unique and not 'main' (the task's own sizes)")
    for label in ("flops", "bytes"):
        expr = getattr(manifest, label)
        if expr:
            _eval_size_expr(expr, sizes, where)  # fail now, not mid-evaluation
    return manifest


def _line_of(text: str, loc: Any) -> int | None:
    """Best-effort line where the last string key of a validation path is assigned (`key =` or `[key]`)."""
    keys = [p for p in loc if isinstance(p, str)]
    if not keys:
        return None
    pattern = re.compile(rf"(^|[{{,\s.\[]){re.escape(keys[-1])}\s*(=|\])")
    for i, line in enumerate(text.splitlines(), 1):
        if pattern.search(line.split("#", 1)[0]):
            return i
    return None


_ARITH = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
          ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a**b}


def _eval_size_expr(expr: str, sizes: dict[str, int], where: str) -> float:
    """Evaluate arithmetic over module sizes (`2 * M * N * K`) without eval()."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in sizes:
                raise TaskError(where, f"expression {expr!r}: unknown size {node.id!r}")
            return sizes[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return _ARITH[type(node.op)](ev(node.left), ev(node.right))
        raise TaskError(where, f"expression {expr!r}: only numbers, sizes and + - * / // ** are allowed")

    try:
        tree = parsing.parse(expr, mode="eval")
    except SyntaxError:
        raise TaskError(where, f"expression {expr!r} is not valid arithmetic") from None
    try:
        return float(ev(tree))
    except (ArithmeticError, ValueError) as e:  # division by zero, overflow
        raise TaskError(where, f"expression {expr!r} at sizes {sizes}: {e}") from None
