"""The `compile` seed: torch.compile's own Triton kernels for a task, written out as a standalone candidate.
Runs jailed, like every step that runs task code:

    python -m sandbox.harness.inductor_seed SPEC

For every shape in spec["shapes"] (the shapes the gate checks, with their layouts) the task's Model is compiled by
Inductor, static shapes, one graph (a graph break is refused). Inductor's output code is caught before Inductor
builds anything, so no GPU and no Inductor runtime are needed: on the CPU, Inductor writes Triton kernels
(config.cpu_backend = "triton") that run in Triton's interpreter. From each graph the candidate keeps:
  - the kernels, as @triton.jit source (Inductor's heuristics decorator dropped, its few Triton helpers copied in);
  - the wrapper's call(), as a plain function, each launch made with an explicit grid (Grid1D/2D/3D);
  - the launch configurations Inductor's heuristics listed for each kernel, then variants near its first (block
    size, warps, pipeline depth), and a tunable constant per kernel of a timed shape choosing among them
    (TUNABLES): the tuner does what Inductor's autotuner does, measured by the gate, and a step beyond.
ModelNew subclasses the task's Model (its source is copied in), so it draws the same parameters; it runs the
graph captured for its inputs' shapes, strides and dtypes, and the reference forward at any shape not captured.

Result (spec["result"]): {"status": "captured", "candidate_file", "shapes": [...], "kernels", "library_calls"} or
{"status": "failed", "reason", "traceback"}. The candidate written is untrusted like any other: the gate decides.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import re
import sys
import textwrap
import traceback
from pathlib import Path
from contextlib import ExitStack
from unittest import mock

from sandbox.harness.common import prepare_device, write_result

GRIDS = {"Grid1D": "x", "Grid2D": "xy", "Grid3D": "xyz"}  # grid type -> the axes its dimensions cover
# Wrapper names the generated call() may use, defined in the candidate's preamble.
LIBRARY_CALL_RE = re.compile(r"\bextern_kernels\.(\w+)|\baten\.(\w+)")
RUN_RE = re.compile(r"^(\s*)(\w+)\.run\((.*?),\s*stream=\w+\)\s*$")
KERNEL_RE = re.compile(r"(\w+) = async_compile\.triton\('(\w+)', '''(.*?)''', device_str='(\w+)'\)", re.S)


class Unsupported(Exception):
    """A graph this generator cannot write out (said in the result, and the run starts from another seed)."""


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    prepare_device(spec["device"])
    try:
        result = write_seed(spec)
    except Exception as exc:  # noqa: BLE001 - any failure is this seed's, said in the result
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:2000],
                  "traceback": traceback.format_exc()[-4000:]}
    write_result(spec["result"], result)
    return 0


def write_seed(spec: dict) -> dict:
    import torch

    from sandbox.harness.task_code import build_model, init_inputs, load_task, make_inputs, set_sizes

    work = Path(spec["workdir"])
    task = load_task(spec)
    graphs, shapes = [], []
    dropped = []
    for shape in spec["shapes"]:
        set_sizes(task, shape)
        try:
            init = init_inputs(spec, task, 0)
            inputs = _laid_out(make_inputs(spec, task, shape, 0), shape.get("layout", "contiguous"))
            model = build_model(spec, task, init, 0, spec["device"], None if not spec["dtype"] else
                                getattr(torch, spec["dtype"]))
            with torch.no_grad():
                expected = model(*inputs)
        except Exception as exc:  # noqa: BLE001 - the task's own code failed at this shape
            if shape["name"] == "main" or shape.get("timed", True):
                raise
            # A derived shape the reference cannot run: the referee drops it too, so no graph is needed there.
            dropped.append(f"{shape['name']} ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        code, arg_map = _capture(model, inputs, spec["device"])
        key = _key(inputs)
        if any(g["key"] == key for g in graphs):
            continue  # two shapes with the same inputs (sizes below 16 are not derived): one graph
        single = isinstance(expected, torch.Tensor)
        graphs.append({"key": key, "code": code, "arg_map": arg_map, "single": single,
                       "timed": shape.get("timed", True), "shape": shape["name"]})
        shapes.append(shape["name"])
    source, kernels, library = generate(spec, graphs, work)
    path = work / "candidate.py"
    path.write_text(source)
    return {"status": "captured", "candidate_file": str(path), "shapes": shapes, "kernels": kernels,
            "library_calls": sorted(library), "dropped_shapes": dropped}


def _laid_out(args: list, layout: str) -> list:
    """The gate's layout (sandbox/harness/referee.py `_strides`): Inductor specialises on strides, so a strided
    shape gets a graph of its own."""
    import torch

    from sandbox.harness.referee import _strides

    out = []
    for a in args:
        strides = _strides(a.shape, layout) if isinstance(a, torch.Tensor) else None
        if strides is not None:
            b = torch.empty_strided(a.shape, strides, dtype=a.dtype, device=a.device)
            b.copy_(a)
            a = b
        out.append(a)
    return out


def _key(inputs: list) -> tuple:
    import torch

    return tuple((tuple(a.shape), tuple(a.stride()), str(a.dtype).removeprefix("torch."))
                 if isinstance(a, torch.Tensor) else repr(a) for a in inputs)


def _capture(model, inputs: list, device: str) -> tuple[str, list]:
    """Inductor's output code for model(*inputs), and what each of the graph's arguments is: ("param", name),
    ("buffer", name) or ("input", index). Inductor is stopped once the code is written: nothing is built."""
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    import torch.utils._triton as torch_triton
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.graph import GraphLowering

    caught: dict = {}
    named = ([("param", n, t) for n, t in model.named_parameters()] +
             [("buffer", n, t) for n, t in model.named_buffers()] +
             [("input", i, t) for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)])

    def backend(gm, example_inputs):
        if "code" in caught:
            raise Unsupported("the forward compiles to more than one graph")
        mapping = []
        for t in example_inputs:
            found = next(((kind, name) for kind, name, u in named if u is t), None)
            if found is None:
                raise Unsupported("a graph argument is neither a parameter, a buffer nor an input")
            mapping.append(found)
        caught["arg_map"] = mapping

        class Written(Exception):
            pass

        def save_output_code(code):
            caught["code"] = code
            raise Written

        with mock.patch.object(GraphLowering, "save_output_code", save_output_code):
            try:
                compile_fx(gm, example_inputs)
            except Exception:
                if "code" not in caught:
                    raise
        return gm.forward

    torch._dynamo.reset()
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(inductor_config, "cpu_backend", "triton"))
        if device == "cpu":  # no Triton driver on a CPU host: Inductor's cache key asks one for its hash
            stack.enter_context(mock.patch.object(torch_triton, "triton_hash_with_backend", lambda: "0" * 64))
        stack.enter_context(torch.no_grad())
        try:
            torch.compile(model, backend=backend, fullgraph=True, dynamic=False)(*inputs)
        except Exception as exc:
            if "code" not in caught:
                cause = exc.__cause__ or exc
                raise Unsupported(f"torch.compile could not capture one graph: {type(cause).__name__}: "
                                  f"{str(cause)[:300]}") from exc
    if "code" not in caught:
        raise Unsupported("torch.compile produced no graph (nothing to compute?)")
    return caught["code"], caught["arg_map"]


# --- writing the candidate --------------------------------------------------------------------------------------

def generate(spec: dict, graphs: list[dict], work: Path) -> tuple[str, int, set[str]]:
    kernels_src, graph_src, metas, tunables, constants = [], [], {}, {}, []
    helpers: set[str] = set()
    library: set[str] = set()
    for gi, g in enumerate(graphs):
        names = {}
        for var, kname, ksrc, _dev in KERNEL_RE.findall(g["code"]):
            new = f"g{gi}_{kname}"
            names[var] = new
            body, used = _kernel_body(ksrc, kname, new)
            helpers |= used
            kernels_src.append(body)
            meta = _kernel_meta(ksrc, kname, work / f"inductor_g{gi}_{kname}.py")
            metas[new] = meta
            const = new.upper() + "_CONFIG"
            constants.append(f"{const} = {_default_config(meta, spec['device'])}")
            if g["timed"] and len(meta["configs"]) > 1:
                tunables[const] = list(range(len(meta["configs"])))
        call_body, libs = _call_body(g["code"], names)
        library |= libs
        graph_src.append(f"def _graph_{gi}(args):\n    \"\"\"Inductor's call() at shape {g['shape']}.\"\"\"\n"
                         + textwrap.indent(call_body, "    "))
    helper_src = _helpers(helpers)
    graphs_table = ",\n".join(f"    {tuple(g['key'])!r}: (_graph_{gi}, {g['arg_map']!r}, {g['single']!r})"
                              for gi, g in enumerate(graphs))
    import torch
    import triton

    header = f'''"""torch.compile's own kernels for {spec["task_display"]}, written out as a standalone candidate (the
`compile` seed; sandbox/harness/inductor_seed.py). Captured on {spec["device"]} with torch {torch.__version__} and Triton
{triton.__version__}: {len(metas)} Triton kernels in {len(graphs)} graph(s), one per shape the gate checks
({", ".join(g["shape"] for g in graphs)}). Library calls kept from Inductor's code: {", ".join(sorted(library)) or "none"}.

Each kernel's launch configuration is one of KERNEL_META's: first those Inductor's heuristics listed for it
("inductor_configs" of them), then variants near its first (block, warps, stages); the *_CONFIG constants choose,
and TUNABLES lets the tuner choose per timed shape. At inputs of a shape not captured, ModelNew
runs the reference forward.
"""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl
from triton.language import math as tl_math
from triton.language.extra import libdevice

'''
    preamble = '''
if os.environ.get("TRITON_INTERPRET") == "1":
    class libdevice:  # noqa: N801 - Triton's interpreter has no libdevice: the same functions, from tl
        # looked up when called: the interpreter patches tl's functions only while a kernel runs
        for _name in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "floor", "ceil", "erf", "abs"):
            locals()[_name] = staticmethod(lambda x, _name=_name: getattr(tl, _name)(x))
        fabs = abs

        @staticmethod
        def isnan(x):
            return x != x

        @staticmethod
        def isinf(x):
            return tl.abs(x) == float("inf")

        @staticmethod
        def tanh(x):
            return 2.0 * tl.sigmoid(2.0 * x) - 1.0

        @staticmethod
        def log1p(x):
            return tl.log(1.0 + x)

        @staticmethod
        def expm1(x):
            return tl.exp(x) - 1.0

        @staticmethod
        def pow(x, y):
            return tl.exp2(y * tl.log2(x))

        @staticmethod
        def signbit(x):
            return x < 0

        @staticmethod
        def trunc(x):
            return tl.where(x < 0, tl.ceil(x), tl.floor(x))


# --- what Inductor's call() uses ----------------------------------------------------------------------------
aten = torch.ops.aten


def empty_strided_cuda(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cuda")


def empty_strided_cpu(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


def reinterpret_tensor(t, size, stride, offset=0):
    return t.as_strided(size, stride, offset)


def assert_size_stride(t, size, stride, what=""):
    if tuple(t.shape) != tuple(size) or tuple(t.stride()) != tuple(stride):
        raise AssertionError(f"{what}: {tuple(t.shape)}/{t.stride()} is not {tuple(size)}/{tuple(stride)}")


def assert_alignment(*_):
    pass


def get_raw_stream(_):
    return None


class extern_kernels:
    """Inductor's library calls, as the torch functions they are."""
    mm = staticmethod(torch.mm)
    addmm = staticmethod(torch.addmm)
    bmm = staticmethod(torch.bmm)
    baddbmm = staticmethod(torch.baddbmm)
    convolution = staticmethod(torch.convolution)


def _launch(name, args):
    """One launch with an explicit grid: the config its constant chooses, and the grid Inductor would compute."""
    kernel, meta = globals()[name], KERNEL_META[name]
    config = meta["configs"][globals()[name.upper() + "_CONFIG"]]
    bound = dict(zip(meta["params"], args))
    blocks = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    grid = tuple(triton.cdiv(bound[axis + "numel"], blocks.get(axis.upper() + "BLOCK", 1)) for axis in meta["axes"])
    kernel[grid](*args, **blocks, num_warps=config["num_warps"],
                 num_stages=config["num_stages"])
'''
    model = f'''
# --- the captured graphs, and ModelNew ----------------------------------------------------------------------
GRAPHS = {{
{graphs_table},
}}


def _key(inputs):
    return tuple((tuple(a.shape), tuple(a.stride()), str(a.dtype).removeprefix("torch."))
                 if isinstance(a, torch.Tensor) else repr(a) for a in inputs)


class ModelNew(Model):
    """The task's Model (same parameters, same draws) with its forward run by the kernels above."""

    def forward(self, *inputs):
        graph = GRAPHS.get(_key(inputs))
        if graph is None:
            return super().forward(*inputs)
        run, arg_map, single = graph
        args = [self.get_parameter(n) if kind == "param" else self.get_buffer(n) if kind == "buffer" else inputs[n]
                for kind, n in arg_map]
        out = run(args)
        return out[0] if single else tuple(out)
'''
    task_src = Path(spec["task_file"]).read_text()
    source = "\n".join([
        header,
        "# --- the task's reference: ModelNew subclasses its Model ------------------------------------------",
        task_src.rstrip(), "",
        "# --- Inductor's Triton helpers the kernels use ------------------------------------------------------",
        helper_src, "",
        "# --- the kernels -------------------------------------------------------------------------------------",
        "\n\n".join(kernels_src), "",
        "# Tunables: the tuning proposer rewrites these constants (an index into the kernel's KERNEL_META configs).",
        "\n".join(constants),
        f"TUNABLES = {tunables!r}",
        "TUNED_BY_SHAPE = {}",
        "KERNEL_META = {\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in metas.items()) + "}",
        preamble,
        "\n\n".join(graph_src),
        model])
    return source, len(metas), library


def _default_config(meta: dict, device: str) -> int:
    """Inductor's first config; in Triton's interpreter (the CPU) the widest one: it runs programs one by one."""
    if device != "cpu":
        return 0
    blocks = [math.prod(v for k, v in c.items() if k.endswith("BLOCK")) for c in meta["configs"]]
    return blocks.index(max(blocks))


def _kernel_body(src: str, name: str, new: str) -> tuple[str, set[str]]:
    """The @triton.jit function alone, renamed, with triton_helpers.X calls made local."""
    start = src.find("@triton.jit\ndef " + name + "(")
    if start < 0:
        raise Unsupported(f"kernel {name}: no @triton.jit function of that name in Inductor's code")
    body = src[start:].replace(f"def {name}(", f"def {new}(", 1)
    used = set(re.findall(r"\btriton_helpers\.(\w+)", body))
    body = re.sub(r"\btriton_helpers\.(\w+)", r"\1", body)
    for module in ("triton_heuristics", "DeviceProperties", "AutotuneHint", "ReductionHint", "TileHint"):
        if re.search(rf"\b{module}\b", body):
            raise Unsupported(f"kernel {name} uses Inductor's {module} in its body")
    return body.rstrip() + "\n", used


def _kernel_meta(src: str, name: str, path: Path) -> dict:
    """The kernel's launch data, from Inductor's own heuristics: loading the kernel's module builds its
    CachingAutotuner (which compiles nothing until launched)."""
    path.write_text(src)  # Triton wants kernel source in a real file
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    tuner = getattr(module, name)
    grid = tuner.inductor_meta.get("grid_type")
    if grid not in GRIDS:
        raise Unsupported(f"kernel {name}: grid {grid} is not written out yet (Grid1D/2D/3D are)")
    signature = tuner.triton_meta["signature"]
    constants = tuner.triton_meta.get("constants") or {}
    # call() passes every argument but the config's block sizes, a specialised constant (xnumel = 1) included
    params = [p for p, t in signature.items() if t != "constexpr" or p in constants]
    configs = []
    for c in tuner.configs:
        entry = dict(c.kwargs) | {"num_warps": c.num_warps, "num_stages": c.num_stages}
        if entry not in configs:
            configs.append(entry)
    if not configs:
        raise Unsupported(f"kernel {name}: Inductor listed no launch configuration")
    listed = len(configs)
    for variant in _variants(configs[0], src):
        if variant not in configs:
            configs.append(variant)
    return {"params": params, "axes": GRIDS[grid], "configs": configs, "inductor_configs": listed}


MAX_BLOCK_ELEMENTS = 1 << 16  # XBLOCK x R0_BLOCK a variant may hold: beyond, registers spill (or it does not build)


def _variants(base: dict, src: str) -> list[dict]:
    """Launch configurations near Inductor's first, for the tuner: Inductor often lists one (pointwise kernels
    without max-autotune), and its heuristics pick without measuring. XBLOCK halved, doubled and quadrupled (up
    to the x extent and MAX_BLOCK_ELEMENTS with the kernel's reduction block), num_warps halved and doubled, and two
    more pipeline depths. A variant that does not build gets its compile_error like any candidate."""
    out = []
    fixed = re.search(r"\bxnumel = (\d+)", src)
    x_cap = 1 << max(0, (int(fixed.group(1)) - 1).bit_length()) if fixed else 4096
    r_block = re.search(r"\bR0_BLOCK: tl\.constexpr = (\d+)", src)
    r_elems = int(r_block.group(1)) if r_block else int(base.get("R0_BLOCK", 1))
    if "XBLOCK" in base:
        for xb in (base["XBLOCK"] // 2, base["XBLOCK"] * 2, base["XBLOCK"] * 4):
            if 1 <= xb <= x_cap and xb * r_elems <= MAX_BLOCK_ELEMENTS:
                out.append(base | {"XBLOCK": xb})
    for warps in (base["num_warps"] // 2, base["num_warps"] * 2):
        if 1 <= warps <= 32:
            out.append(base | {"num_warps": warps})
    for stages in (1, 2, 3):
        if stages != base["num_stages"]:
            out.append(base | {"num_stages": stages})
    return out[:8]


def _call_body(code: str, names: dict[str, str]) -> tuple[str, set[str]]:
    """Inductor's Runner.call body, dedented, with each kernel.run(...) an explicit _launch."""
    match = re.search(r"\n    def call\(self, args\):\n(.*?)\n(?=\S)", code, re.S)
    if match is None:
        raise Unsupported("no call() in Inductor's output code")
    lines, library = [], set()
    for line in textwrap.dedent(match.group(1)).splitlines():
        run = RUN_RE.match(line)
        if run:
            indent, var, args = run.groups()
            if var not in names:
                raise Unsupported(f"call() launches {var}, which is not a Triton kernel of this graph")
            line = f"{indent}_launch({names[var]!r}, ({args},))"
        elif re.search(r"\.run\(", line):
            raise Unsupported(f"a launch this generator cannot read: {line.strip()[:200]}")
        if not line.lstrip().startswith("#"):
            library |= {a or b for a, b in LIBRARY_CALL_RE.findall(line)}
        lines.append(line)
    return "\n".join(lines).rstrip() + "\n", library


def _helpers(used: set[str]) -> str:
    """Source of the triton_helpers functions the kernels call, and the ones those call."""
    if not used:
        return ""
    from torch._inductor.runtime import triton_helpers

    # @triton.jit functions (a JITFunction, or in the interpreter an InterpretedFunction), not Triton builtins
    module_names = {n for n, v in vars(triton_helpers).items() if inspect.isfunction(getattr(v, "fn", None))}
    todo, done, out = sorted(used), set(), []
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        fn = getattr(triton_helpers, name, None)
        if fn is None:
            raise Unsupported(f"Inductor helper {name} not found")
        src = textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn)))
        if "triton_builtin" in src or "_semantic" in src:
            raise Unsupported(f"Inductor helper {name} is a Triton builtin, not portable source")
        src = re.sub(r"(?<![\w.])math\.", "tl_math.", src)
        if not src.lstrip().startswith("@"):
            src = "@triton.jit\n" + src
        out.append(src)
        todo += [n for n in module_names - done if re.search(rf"(?<![\w.]){n}\b", src)]  # called or passed
    consts = "_LOG_2_E: tl.constexpr = tl.constexpr(1.4426950408889634)\n" if "_LOG_2_E" in "".join(out) else ""
    fast = [INTERPRETED_REDUCTIONS[n] for n in sorted(done & set(INTERPRETED_REDUCTIONS))]
    if fast:  # the interpreter calls a custom combine once per element pair (0.5 s per 8 x 128 softmax): tl's own
        # reduction is the same one there (NaN propagation of max/min is not judged by the gate)
        out.insert(0, 'if os.environ.get("TRITON_INTERPRET") == "1":\n' + "\n".join(fast))
    return consts + "\n\n".join(reversed(out))


INTERPRETED_REDUCTIONS = {
    "max2": "    @triton.jit\n    def max2(a, dim):\n        return tl.max(a, dim)\n",
    "min2": "    @triton.jit\n    def min2(a, dim):\n        return tl.min(a, dim)\n",
}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
