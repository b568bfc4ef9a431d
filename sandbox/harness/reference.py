"""Trusted side of an evaluation: runs the task's `Model`, never the candidate.

    python -m sandbox.harness.reference prepare SPEC   inputs for every shape and seed, eager/compile timings
    python -m sandbox.harness.reference check SPEC     float64 reference vs the candidate's saved outputs

SPEC is a JSON file written by the controller (appliance.evaluation.pipeline). Results go to the file the spec
names; a task that raises is reported as {"status": "task_error"} with the task file's line.
"""

from __future__ import annotations

import json
import math
import sys
import time
import traceback
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from sandbox.harness.common import (Stages, as_outputs, cast_floating, cpu_seconds, device_turn, environment,
                                    error_info, load_module, prepare_device, rss_peak, tensor_bytes, to_device,
                                    turn_batches, write_result)
from sandbox.harness.provenance import record_ops
from sandbox.harness.timing import rollable
from sandbox.harness.transfer import OutputRecord, Staging, in_memory, load_inputs, output_file_limit, output_name


class TaskFault(Exception):
    """The task's own code failed: reported against the task file, not the candidate."""

    def __init__(self, what: str, exc: BaseException, task_path: str):
        self.info = error_info(exc, task_path)
        self.info["what"] = what
        super().__init__(f"{what}: {self.info['type'].rsplit('.', 1)[-1]}: {self.info['message']}")


def main(argv: list[str]) -> int:
    command, spec_path = argv
    spec = json.loads(Path(spec_path).read_text())
    prepare_device(spec["device"])
    try:
        result = {"prepare": prepare, "check": check}[command](spec)
    except BaseException as exc:  # noqa: BLE001 - sorted below; anything else is our bug and propagates
        oom = _device_out_of_memory(exc)
        if oom is not None:
            # Beside other evaluations the device may simply have been full: the controller runs it again alone.
            result = {"status": "out_of_memory", "reason": str(exc)[:2000], "message": oom}
        elif isinstance(exc, TaskFault):
            result = {"status": "task_error", "reason": str(exc), **exc.info}
        else:
            raise
    write_result(spec["result"], result)
    return 0


def _device_out_of_memory(exc: BaseException | None) -> str | None:
    """The message of a device out-of-memory error in exc or what caused it, or None."""
    while exc is not None:
        if type(exc).__name__ == "OutOfMemoryError":
            return str(exc)[:2000]
        exc = exc.__cause__ or exc.__context__
    return None


def _task_call(what: str, spec: dict, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of the task's code is a task error
        raise TaskFault(what, exc, spec["task_display"]) from exc


def _load_task(spec: dict):
    return _task_call("loading the task", spec, load_module, spec["task_file"], "task", spec["task_display"])


def _dtype(spec: dict):
    import torch

    return getattr(torch, spec["dtype"]) if spec["dtype"] else None


def _build_model(spec, task, init: list, seed: int, device: str, dtype):
    import torch

    torch.manual_seed(seed)
    model = _task_call(f"Model(*get_init_inputs()) (seed {seed})", spec, lambda: task.Model(*init))
    model = model.to(device)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def _make_inputs(spec: dict, task, shape: dict, seed: int) -> tuple[list, list]:
    import torch

    for name, value in shape["sizes"].items():
        setattr(task, name, value)
    torch.manual_seed(seed)
    init = list(_task_call("get_init_inputs()", spec, task.get_init_inputs))
    torch.manual_seed(seed)
    # Inputs are made on the evaluation device: drawing gigabytes of random numbers on the CPU is slow.
    with torch.device(spec["device"]):
        args = list(_task_call("get_inputs()", spec, task.get_inputs))
    args = _apply_distribution(args, shape["distribution"], seed)
    dtype = _dtype(spec)
    if dtype is not None:
        args = cast_floating(args, dtype)
    return init, args


def _apply_distribution(args: list, dist: dict, seed: int) -> list:
    """Replace floating-point inputs' values; shapes and dtypes stay as get_inputs() made them."""
    import torch

    if dist["kind"] == "default":
        return args
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            shape, dtype, dev = a.shape, a.dtype, a.device
            gen = torch.Generator(device=dev).manual_seed(10_007 * seed + len(out) + 1)
            if dist["kind"] == "uniform":
                a = torch.rand(shape, generator=gen, device=dev)
            else:
                a = torch.randn(shape, generator=gen, device=dev)
                if dist["kind"] == "scaled":
                    a = a * dist["scale"]
                elif dist["kind"] == "outliers":
                    mask = torch.rand(shape, generator=gen, device=dev) < dist["fraction"]
                    a = torch.where(mask, a * dist["scale"], a)
            a = a.to(dtype)
        out.append(a)
    return out


def _input_path(spec: dict, shape: str, seed: int) -> Path:
    return Path(spec["inputs_dir"]) / f"{shape}-{seed}.pt"


def prepare(spec: dict) -> dict:
    """Write every input set, record the eager outputs' dtypes/shapes, and time the baselines; with
    spec["ceilings"], first measure the GPU's ceilings (sandbox/harness/ceilings.py) while this process holds the
    device anyway (a process of their own held it exclusively for its start-up too)."""
    import torch

    stages = Stages()
    device, dtype = spec["device"], _dtype(spec)
    ceilings = None
    if spec.get("ceilings") and device == "cuda":
        # First, on an empty device and before any task code: whatever goes wrong here is ours, not the task's.
        from sandbox.harness.ceilings import measure

        try:
            ceilings = measure()
        except Exception as exc:  # noqa: BLE001 - without ceilings there is no roofline; the task is fine
            ceilings = {"error": f"measuring the GPU's ceilings failed: {type(exc).__name__}: {exc}"[:500]}
        torch.cuda.empty_cache()  # the inputs need the room the ceilings' gigabyte buffers had
        stages.done("ceilings")
    task = _load_task(spec)
    stages.done("load")
    shapes_out, timings = [], {}
    for shape in spec["shapes"]:
        input_sets, model = [], None
        for seed in spec["seeds"]:
            init, args = _make_inputs(spec, task, shape, seed)
            cpu_args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
            torch.save({"init": init, "args": cpu_args}, _input_path(spec, shape["name"], seed))
            input_sets.append(to_device(args, device, shape["layout"]))
            del args, cpu_args
            if model is None:
                model = _build_model(spec, task, init, seed, device, dtype)
        stages.done("inputs")
        with torch.no_grad():
            result, ops = _task_call(f"Model.forward at shape {shape['name']}", spec, record_ops, model,
                                     *input_sets[0])
        outs = as_outputs(result)
        if outs is None:
            raise TaskFault("Model.forward", TypeError(f"returned {type(result).__name__}, not tensor(s)"),
                            spec["task_display"])
        shapes_out.append({
            "name": shape["name"],
            "input_shapes": [list(a.shape) for a in input_sets[0] if isinstance(a, torch.Tensor)],
            "outputs": [{"dtype": str(o.dtype).removeprefix("torch."), "shape": list(o.shape)} for o in outs],
            "ops": ops,
        })
        # torch.compile recompiles for every new shape: time it on the main shape only, where speedups are quoted.
        names = spec["baselines"] if shape is spec["shapes"][0] else [b for b in spec["baselines"] if b != "compile"]
        timings[shape["name"]] = _time_baselines(spec, names, model, input_sets, device,
                                                 energy=shape is spec["shapes"][0], stages=stages)
        del input_sets
    result = {"status": "ok", "shapes": shapes_out, "timings": timings, "environment": environment(device)}
    if ceilings is not None:
        result["ceilings"] = ceilings
    return result | {"stage_s": stages.summary()}


def _time_baselines(spec: dict, names: list[str], model, input_sets: list, device: str, energy: bool,
                    stages: Stages) -> dict:
    """Eager and torch.compile, timed exactly like the candidate; a baseline that fails is recorded, not fatal.
    Their seconds go to stages "eager" and "compile" (torch.compile's own compilation included)."""
    import torch

    from sandbox.harness.energy import EnergyMeter
    from sandbox.harness.timing import time_calls

    meter = EnergyMeter() if device == "cuda" and energy else None
    out = {}
    for name in names:
        try:
            fn = model if name == "eager" else torch.compile(model)
            out[name], _ = time_calls(fn, input_sets, device, budget_s=spec["timing_budget_s"], energy_meter=meter)
        except Exception as exc:  # noqa: BLE001 - e.g. no C++ compiler for inductor on this host
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).strip()[:500]}"}
        if device == "cuda":
            torch.cuda.synchronize()
        stages.done(name)
    return out


def check(spec: dict) -> dict:
    """Recompute the reference in float64 from the saved inputs and compare the candidate's saved outputs.
    Started beside the candidate (with `go_file`): it loads the task, then waits until the controller says go (the
    outputs are vetted) or stop. Each case's files are opened and checked first, then its tensors uploaded,
    recomputed and compared in a shared turn (sandbox/gate.py), several cases a turn: between turns, waiting
    measurements go ahead."""
    t_start = time.perf_counter()
    task = _load_task(spec)
    t_ready = time.perf_counter()
    # Nothing touches the device before go (not even to lock pages, which makes a context): until its first turn
    # request this process is not counted in the device's memory budget (sandbox/gate.py).
    if spec.get("go_file") and not _told_to_go(Path(spec["go_file"]), Path(spec["stop_file"])):
        return {"status": "cancelled"}
    t0 = time.perf_counter()
    files = _Files(spec)
    for value in files.all_inputs():  # locked once, for every case (the timed one reads a seed's inputs again)
        files.staging.pin(value, keep=True)
    stages = {"start": round(t_ready - t_start, 3), "wait_for_candidate": round(t0 - t_ready, 3),
              "pin_inputs": round(time.perf_counter() - t0, 3)}
    result = _check(spec, files, task, stages)
    _sample_memory(stages)
    return result | {"stage_s": {k: round(v, 3) for k, v in stages.items()} | {"cpu_s": cpu_seconds()}}


@contextmanager
def _case_turn(stages: dict):
    """A shared turn for one case; its wait and its length are added to the check's stages."""
    t0 = time.perf_counter()
    with device_turn(shared=True):
        t1 = time.perf_counter()
        yield
    stages["wait_for_device"] = stages.get("wait_for_device", 0.0) + t1 - t0
    stages["compare"] = stages.get("compare", 0.0) + time.perf_counter() - t1
    _sample_memory(stages)


def _sample_memory(stages: dict) -> None:
    """The most private memory seen so far, as the candidate's Stages report it."""
    if (peak := rss_peak(stages.get("rss_anon_peak_gib"))) is not None:
        stages["rss_anon_peak_gib"] = peak


def _told_to_go(go: Path, stop: Path) -> bool:
    while True:
        if go.exists():
            return True
        if stop.exists():
            return False
        time.sleep(0.01)


class _Files:
    """The saved inputs (prepare's files, memory-mapped: nothing is read until used) and the candidate's output files
    (sandbox/harness/transfer.py: checked before anything is read, read as data). Both reach the device through the
    staging buffers, inside the case's turn."""

    def __init__(self, spec: dict):
        self.staging = Staging(spec["device"], pin_files=in_memory(spec["inputs_dir"], spec["outputs_dir"]))
        self.spec, self._inputs = spec, {}
        self.outputs_max = {s["name"]: output_file_limit(_outputs_nbytes(s["outputs"])) for s in spec["prepared_shapes"]}

    def inputs(self, shape: str, seed: int) -> dict:
        path = _input_path(self.spec, shape, seed)
        if path not in self._inputs:  # mapped shared where they are locked in place (see load_inputs)
            self._inputs[path] = load_inputs(path, shared=self.staging.locks_in_place)
        return self._inputs[path]

    def all_inputs(self) -> list:
        """Every saved input tensor the cases will upload (the inputs of each shape and seed)."""
        return [a for shape in self.spec["shapes"] for seed in self.spec["seeds"]
                for a in self.inputs(shape["name"], seed)["args"]]

    def output(self, shape: str, name: str) -> OutputRecord:
        """The record of output file pair `name` of `shape`; ValueError says what is wrong with it."""
        return OutputRecord(Path(self.spec["outputs_dir"]), name, self.outputs_max[shape])

    def upload(self, values: list, layout: str) -> list:
        return to_device(values, self.spec["device"], layout, self.staging.upload)

    def pin(self, values: list, record: OutputRecord) -> None:
        """A case's inputs and outputs page-locked in place before its turn (transfer.Staging.pin)."""
        for v in values:
            self.staging.pin(v)
        record.pin(self.staging)


def _check(spec: dict, files: _Files, task, stages: dict) -> dict:
    """Cases are checked a batch at a time (up to a few GiB of inputs and outputs: all small shapes together), each
    batch in one shared turn: a turn costs a wait behind the measurements in progress. A case's files are opened
    and checked before the turn; its tensors go to the device in the turn, one case at a time."""
    expected = {s["name"]: s["outputs"] for s in spec["prepared_shapes"]}
    jobs = []  # (bytes it stages, what stages it: returns the case's result, or what computes it in the turn)
    for shape in spec["shapes"]:
        name = shape["name"]
        # Sizes from trusted data only (prepare's input files, its record of the outputs), never the candidate's.
        inputs = tensor_bytes(files.inputs(name, spec["seeds"][0])["args"])
        outputs = _outputs_nbytes(expected[name])
        for seed in spec["seeds"]:
            jobs.append((inputs + outputs, partial(_stage_case, spec, files, task, shape, seed, expected[name])))
        jobs.append((inputs + outputs, partial(_stage_timed_case, spec, files, task, shape, expected[name])))
    cases = []
    for batch in turn_batches(jobs, lambda job: job[0]):
        t0 = time.perf_counter()
        results = [stage() for _, stage in batch]
        stages["open_files"] = stages.get("open_files", 0.0) + time.perf_counter() - t0
        if any(callable(r) for r in results):
            with _case_turn(stages):
                results = [r() if callable(r) else r for r in results]  # one case's tensors on the device at a time
            files.staging.unpin()
        cases += results
    return {"status": "ok", "cases": cases}


def _outputs_nbytes(outputs: list[dict]) -> int:
    """Bytes of one call's outputs, from prepare's record of them (dtype and shape of each)."""
    import torch

    return sum(math.prod(o["shape"]) * getattr(torch, o["dtype"]).itemsize for o in outputs)


def _stage_case(spec: dict, files: _Files, task, shape: dict, seed: int, expected: list):
    """One correctness call's outputs against the float64 reference: checked now, compared by what it returns."""
    import torch

    from sandbox.harness.compare import compare_outputs

    case = {"shape": shape["name"], "seed": seed}
    where = f"at shape {shape['name']} ({_sizes_text(shape['sizes'])}), seed {seed}"
    saved = files.inputs(shape["name"], seed)
    try:
        record = files.output(shape["name"], output_name(shape["name"], seed))
    except ValueError as exc:
        return case | {"kind": "wrong_output", "reason": f"unreadable candidate output {where}: {exc}"}
    files.pin(saved["args"], record)

    def on_device() -> dict:
        device, dtype = spec["device"], _dtype(spec)
        for name, value in shape["sizes"].items():
            setattr(task, name, value)
        model = _build_model(spec, task, saved["init"], seed, device, dtype).to(torch.float64)
        args = cast_floating(files.upload(saved["args"], shape["layout"]), torch.float64)
        with torch.no_grad():
            refs = as_outputs(_task_call("float64 reference", spec, model, *args))
        del args, model
        outs = _candidate_outputs(record, files.staging)
        if isinstance(outs, str):
            return case | {"kind": "wrong_output", "reason": f"unreadable candidate output {where}: {outs}"}
        failure = compare_outputs(outs, refs, expected, spec["tolerances"], where)
        return case | (failure or {"kind": "pass", "reason": ""})

    return on_device


def _stage_timed_case(spec: dict, files: _Files, task, shape: dict, expected: list):
    """The output of one random timed call, against the reference for the exact (rolled) inputs it was given."""
    import torch

    from sandbox.harness.compare import compare_outputs

    case = {"shape": shape["name"], "seed": "timed"}
    try:  # written by untrusted code: anything may be wrong with it
        record = files.output(shape["name"], output_name(shape["name"]))
        seed, rolls = record.extra.get("seed"), record.extra.get("rolls")
        if type(seed) is not int or seed not in spec["seeds"] or type(rolls) is not int or not 1 <= rolls < 1 << 31:
            raise ValueError(f"implausible record (seed {seed!r}, rolls {rolls!r})")
    except ValueError as exc:
        return case | {"kind": "timed_output_mismatch",
                       "reason": f"no usable record of a timed call at shape {shape['name']}: {exc}"}
    where = f"in a timed call at shape {shape['name']} ({_sizes_text(shape['sizes'])}), seed {seed} rolled {rolls}"
    saved = files.inputs(shape["name"], seed)
    # Timing uses one model for every input set: the one built under the first seed (see candidate.run).
    first = spec["seeds"][0]
    init = files.inputs(shape["name"], first)["init"]
    files.pin(saved["args"], record)

    def on_device() -> dict:
        device, dtype = spec["device"], _dtype(spec)
        for name, value in shape["sizes"].items():
            setattr(task, name, value)
        args = []
        for a in files.upload(saved["args"], shape["layout"]):
            if rollable(a):
                a = torch.roll(a, rolls, dims=-1)  # what the timing loop did, one step per call (timing.roll_inputs)
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a = a.to(torch.float64)
            args.append(a)
        model = _build_model(spec, task, init, first, device, dtype).to(torch.float64)
        with torch.no_grad():
            refs = as_outputs(_task_call("float64 reference", spec, model, *args))
        del args, model
        outs = _candidate_outputs(record, files.staging)
        failure = ({"kind": "wrong_output", "reason": f"unreadable output: {outs}"} if isinstance(outs, str)
                   else compare_outputs(outs, refs, expected, spec["tolerances"], where))
        if failure:
            failure = {"kind": "timed_output_mismatch", "reason": f"{failure['kind']}: {failure['reason']} (the "
                       "outputs of timed calls must be as correct as those of the correctness calls)"}
        return case | (failure or {"kind": "pass", "reason": ""})

    return on_device


def _candidate_outputs(record: OutputRecord, staging: Staging):
    """The candidate's outputs on the device, or what went wrong as text: the record was checked, but its data is
    the candidate's, and whatever it makes fail here must be the candidate's verdict, not the check's crash (which
    would count as the infrastructure's). Running out of device memory is not the candidate's: it propagates."""
    import torch

    try:
        return record.upload(staging)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def _sizes_text(sizes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items())


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:  # noqa: BLE001 - our bug: say so on stderr, exit non-zero
        traceback.print_exc()
        sys.exit(70)
