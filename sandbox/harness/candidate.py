"""Untrusted side of an evaluation: loads the candidate's `ModelNew`, runs it on the saved inputs, times it.

    python -m sandbox.harness.candidate SPEC

It sees only its own file and its inputs (never the task or the reference outputs). Its outputs are written as raw
output files (sandbox/harness/transfer.py) for the trusted check process; failures are written as data with the
stage they happened in.
"""

from __future__ import annotations

import errno
import gc
import json
import sys
import time
import traceback
from pathlib import Path

from sandbox.harness.common import (Stages, as_outputs, device_memory_freed, device_turn, error_info,
                                    is_compile_error, lend_turns_while_compiling, load_module, prepare_device,
                                    tensor_bytes, to_device, turn_batches, write_result)
from sandbox.harness.integrity import Watch, mutated, settle, snapshot, subclass_outputs
from sandbox.harness.provenance import Launches, record_ops
from sandbox.harness.energy import EnergyMeter
from sandbox.harness.timing import time_calls
from sandbox.harness.transfer import (OutputFiles, PinInBackground, Staging, create_output_file, in_memory, load_inputs,
                                      output_name)


class CandidateFailure(Exception):
    def __init__(self, verdict: str, stage: str, reason: str, info: dict | None = None):
        super().__init__(reason)
        self.verdict, self.stage, self.reason, self.info = verdict, stage, reason, info or {}


# Threads of run() that call into the CUDA driver (locking pages): stopped before the process exits, whatever
# ended the run; a process that exits while the driver is inside a call on another thread may hang in its teardown.
_background: list = []


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    prepare_device(spec["device"])
    if argv[1:] == ["--profile"]:
        return profile(spec)
    try:
        result = run(spec)
    except CandidateFailure as f:
        result = {"status": "failed", "verdict": f.verdict, "stage": f.stage, "reason": f.reason, **f.info}
    finally:
        for work in _background:
            work.cancel()
    write_result(spec["result"], result)
    return 0


def _refused_by_jail(exc: BaseException | None) -> bool:
    """EPERM/EACCES/EROFS: the jail said no (seccomp, read-only or invisible-to-us paths). Honest kernels never
    need anything that ends this way."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _failure(exc: BaseException, stage: str, what: str, path: str) -> CandidateFailure:
    info = error_info(exc, path)
    where = f"candidate.py line {info['line']}" if info["line"] else "candidate"
    short = info["type"].rsplit(".", 1)[-1]
    if _refused_by_jail(exc):
        return CandidateFailure("sandbox_violation", stage, f"the jail refused an operation {what} ({where}): "
                                f"{short}: {info['message'][:600]}", info)
    if isinstance(exc, SyntaxError):
        return CandidateFailure("load_error", "load", f"syntax error in {where}: {exc.msg}", info)
    if is_compile_error(exc):
        return CandidateFailure("compile_error", "compile", f"kernel build failed {what} ({where}): {short}: "
                                f"{info['message'][:600]}", info)
    verdict = "load_error" if stage == "load" else "runtime_error"
    return CandidateFailure(verdict, stage, f"{short} {what} ({where}): {info['message'][:600]}", info)


def _progress(spec: dict, stage: str) -> None:
    """Record the stage reached, so a crash or timeout is reported at the right stage."""
    write_result(spec["result"], {"status": "running", "stage": stage})


def _check_untampered(watch: Watch, stage: str, when: str) -> None:
    changed = watch.changed()
    if changed:
        raise CandidateFailure("tampering", stage, f"the candidate replaced {', '.join(changed)} {when}: timers, "
                               "synchronisation, comparison, serialisation and the harness must not be patched")


def run(spec: dict) -> dict:
    path = spec["candidate_file"]
    stages = Stages()
    _progress(spec, "load")
    import torch  # noqa: F401 - before the candidate, so the watch records torch's own functions

    meter = EnergyMeter() if spec["device"] == "cuda" else None
    launches = Launches()
    launches.install()  # before the candidate is imported: its load_inline modules get counted too
    watch = Watch()
    # The saved inputs are mapped and their pages locked (Staging.pin, seconds per GiB), and the output files made
    # ready, in threads while the candidate's module loads, which is mostly Python's work: they overlap instead of
    # adding up.
    staging = Staging(spec["device"], pin_files=in_memory(spec["inputs_dir"], spec["outputs_dir"]))
    # Mapped shared where they are locked in place (see load_inputs).
    saved_sets = [(shape, seed, load_inputs(Path(spec["inputs_dir"]) / f"{shape['name']}-{seed}.pt",
                                            staging.locks_in_place))
                  for shape in spec["shapes"] for seed in spec["seeds"]]
    pinning = PinInBackground(staging, [a for _, _, saved in saved_sets for a in saved["args"]])
    outputs = OutputFiles(Path(spec["outputs_dir"]), spec.get("output_bytes", {}),
                          Staging(spec["device"], pin_files=staging.pin_files))
    _background.extend([pinning, outputs])
    model_cls = _load_model_class(path, watch)
    stages.done("load")

    device = spec["device"]
    dtype = getattr(torch, spec["dtype"]) if spec["dtype"] else None
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    # 1. In a shared turn per batch of input sets (all shapes' together, up to a few GiB): the sets uploaded from
    #    their memory-mapped files through the staging buffers, the models built and a first call made per shape on
    #    a copy of its inputs: JIT compilation and autotuning stay out of the measuring turn. While Triton compiles,
    #    the shared turn is lent back, so that it does not hold off other measurements.
    lend_turns_while_compiling()
    _progress(spec, "correctness")  # the first call is where kernels compile; what fails there fails correctness
    sets_by_shape: dict[str, list] = {shape["name"]: [] for shape in spec["shapes"]}
    # Both threads are done before any call of the candidate: a driver call of ours (a device-wide synchronise,
    # a page-locking) beside a CUDA graph it captures would make the capture fail.
    pinning.wait()  # the mapped files' pages locked in place, so the uploads are DMAs alone
    stages.done("pin_inputs")  # what locking took beyond the load
    outputs.wait()
    stages.done("output_files")
    for batch in turn_batches(saved_sets, lambda item: tensor_bytes(item[2]["args"])):
        with device_turn(shared=True):
            stages.done("wait_for_device")
            for shape, seed, saved in batch:
                torch.manual_seed(seed)
                try:
                    model = model_cls(*saved["init"]).to(device)
                    if dtype is not None:
                        model = model.to(dtype)
                except BaseException as exc:  # noqa: BLE001
                    raise _failure(exc, "load", "in ModelNew(*init_inputs)", path) from None
                sets = sets_by_shape[shape["name"]]
                uploaded = [staging.upload(a) for a in saved["args"]]  # CPU: the saved tensors themselves
                if not sets:
                    _first_call(model, uploaded, shape, device, sync, path)
                    _check_untampered(watch, "correctness", f"in the first call at shape {shape['name']}")
                sets.append((seed, model, to_device(uploaded, device, shape["layout"])))
                del uploaded
            sync()
        del batch, saved
        stages.done("compile")  # models built, inputs uploaded, the first call (where kernels compile) made
    staged = [(shape, sets_by_shape[shape["name"]]) for shape in spec["shapes"]]
    staging.unpin()  # every upload done (each batch synchronised), before the mappings go
    del saved_sets

    # 2. The correctness calls, in a shared turn: they measure nothing, so other evaluations' light use (uploads,
    #    first calls, checks) may overlap them; only timing needs the device to itself. One call at a time holds a
    #    snapshot of its inputs; the outputs (clones) stay on the device until they are saved after timing.
    timings, provenance, to_save = {}, {}, []
    _progress(spec, "correctness")
    with device_turn(shared=True):
        stages.done("wait_for_device")
        for shape, sets in staged:
            for seed, model, args in sets:
                outs = _correctness_call(model, args, shape, seed, watch, launches, provenance, sync, path, stages)
                to_save.append((output_name(shape["name"], seed), outs, {}))
                del outs

    # 3. With the device to itself: the timing loop.
    _progress(spec, "timing")
    with device_turn():
        stages.done("wait_for_device")
        for shape, sets in staged:
            timed_model, input_sets = sets[0][1], [s[2] for s in sets]  # the first seed's model times all
            try:
                timings[shape["name"]], spot = time_calls(timed_model, input_sets, device,
                                                          budget_s=spec["timing_budget_s"],
                                                          energy_meter=meter if shape["name"] == "main" else None)
            except BaseException as exc:  # noqa: BLE001
                raise _failure(exc, "timing", f"while timing shape {shape['name']}", path) from None
            _check_untampered(watch, "timing", f"while timing shape {shape['name']}")
            # One random timed call's output, for the trusted check (which rebuilds its inputs from set and rolls).
            spot_outs = [o for o in as_outputs(spot["outs"]) or [] if isinstance(o, torch.Tensor)]
            to_save.append((output_name(shape["name"]), spot_outs,
                            {"seed": spec["seeds"][spot["set"]], "rolls": spot["rolls"]}))
            del input_sets, sets[:], spot, spot_outs
            stages.done("timing")

    # 4. Outputs written for the trusted check, then nothing of ours is left on the device: freed, and the gate told
    #    so, so that another evaluation may be admitted (sandbox/gate.py).
    del staged, timed_model, model, args
    _save_outputs(to_save, Path(spec["outputs_dir"]), outputs, sync)
    del to_save
    if device == "cuda":
        gc.collect()  # tensors a model keeps in a reference cycle
        torch.cuda.empty_cache()
    device_memory_freed()
    stages.done("save_outputs")
    return {"status": "ok", "timings": timings, "provenance": provenance,
            "stage_s": stages.summary()}


def _save_outputs(to_save: list, outputs_dir: Path, outputs: OutputFiles, sync) -> None:
    """Each (name, outputs, extra) of `to_save` written as an output file pair (sandbox/harness/transfer.py): the
    files made ready and mapped outside any turn, then the outputs downloaded straight into them, a batch of
    files per shared turn, each batch's device copies let go once it is down."""
    staging = outputs.staging
    files = [(outs, create_output_file(outputs_dir, name, outs, extra, ready=outputs))
             for name, outs, extra in to_save]
    for _, host in files:  # the files' pages locked in place (most already were): the downloads are DMAs alone
        for dst in host:
            staging.pin(dst, read_only=False)
    batches = turn_batches(files, lambda item: tensor_bytes(item[0]))
    to_save.clear()
    files.clear()  # the device copies are now referenced by their batch alone
    for batch in batches:
        with device_turn(shared=True):
            for outs, host in batch:
                for o, dst in zip(outs, host):
                    staging.download(o, dst)
            sync()
        batch.clear()
    outputs.close()


def _load_model_class(path: str, watch: Watch) -> type:
    try:
        module = load_module(path, "candidate")
    except BaseException as exc:  # noqa: BLE001 - SystemExit from the candidate is a load failure too
        raise _failure(exc, "load", "while importing", path) from None
    model_cls = getattr(module, "ModelNew", None)
    if model_cls is None or not isinstance(model_cls, type):
        raise CandidateFailure("load_error", "load", "candidate defines no class ModelNew (KernelBench convention)")
    _check_untampered(watch, "load", "while importing")
    return model_cls


def _first_call(model, args: list, shape: dict, device: str, sync, path: str) -> None:
    """Compile and warm up on a copy of the (uploaded) inputs, made on the device: whatever the call does to them,
    the correctness calls still see the inputs as saved."""
    import torch

    copy = to_device([a.clone() if isinstance(a, torch.Tensor) else a for a in args], device, shape["layout"])
    sync()  # the uploads and the copy are done before forward runs, whichever stream it uses
    try:
        with torch.no_grad():
            outs = as_outputs(model(*copy)) or []
        sync()
        settle()
        # The comparison kernels load on first use (tens of ms): here, not in the measuring turn.
        for values in (copy, outs):
            plain = [v for v in values if type(v) is torch.Tensor]  # odd outputs are judged later, not here
            mutated(plain, plain)
    except BaseException as exc:  # noqa: BLE001
        raise _failure(exc, "correctness", f"in forward (first call) at shape {shape['name']}", path) from None


def _correctness_call(model, args: list, shape: dict, seed: int, watch: Watch, launches: Launches,
                      provenance: dict, sync, path: str, stages: Stages) -> list:
    """One correctness call: its outputs (cloned, on the device) after every check the candidate side can make."""
    import torch

    before = snapshot(args)  # shows whether the call modified its inputs
    where = f"at shape {shape['name']}, seed {seed}"
    try:
        with torch.no_grad():
            if not provenance:  # the first measured call: which ATen ops and own kernels did it run?
                launches.active = True
                result, ops = record_ops(model, *args)
                launches.active = False
                provenance.update(ops=ops, own_launches=launches.count)
            else:
                result = model(*args)
        outs = as_outputs(result)
        # Snapshot on the current stream before any device-wide sync: work still running elsewhere
        # (a side stream, a thread) after forward returned shows up as a difference later.
        early = [o.detach().clone() for o in outs] if outs else None
        sync()  # kernel faults surface here, attributed to this call
        settle()
    except BaseException as exc:  # noqa: BLE001
        raise _failure(exc, "correctness", f"in forward {where}", path) from None
    stages.done("correctness")
    _check_untampered(watch, "correctness", f"in forward {where}")
    if outs is None:
        raise CandidateFailure("wrong_output", "correctness",
                               f"forward returned {type(result).__name__}, expected tensor(s), {where}")
    if early is not None and mutated(outs, early):
        raise CandidateFailure("deferred_work", "correctness",
                               f"the output changed after forward returned {where}: work left running on "
                               "another stream or thread is not part of the call (and not timed)")
    if subclass_outputs(outs):
        raise CandidateFailure("wrong_output", "correctness",
                               f"forward returned a tensor subclass ({', '.join(subclass_outputs(outs))}) "
                               f"{where}: only plain torch.Tensor outputs are accepted")
    changed = mutated(args, before)
    if changed:
        raise CandidateFailure("input_mutated", "correctness", f"forward modified input(s) {changed} in place {where}")
    stages.done("integrity_checks")
    return early  # clones taken before the candidate could change its outputs again


def profile(spec: dict) -> int:
    """One forward call at the main shape inside cudaProfilerStart/Stop, for Nsight Compute
    (`ncu --profile-from-start off`). Runs after the candidate passed the gate, in the same jail."""
    import torch

    module = load_module(spec["candidate_file"], "candidate")
    shape, seed = spec["shapes"][0], spec["seeds"][0]
    saved = torch.load(Path(spec["inputs_dir"]) / f"{shape['name']}-{seed}.pt", weights_only=True, mmap=True,
                       map_location="cuda")
    torch.manual_seed(seed)
    model = module.ModelNew(*saved["init"]).to("cuda")
    if spec["dtype"]:
        model = model.to(getattr(torch, spec["dtype"]))
    args = to_device(saved["args"], "cuda", shape["layout"])
    with torch.no_grad():
        model(*args)  # compiles and warms up outside the profiled range
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        model(*args)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:  # noqa: BLE001 - our bug (or a candidate that broke the harness): exit non-zero
        traceback.print_exc()
        sys.exit(70)
