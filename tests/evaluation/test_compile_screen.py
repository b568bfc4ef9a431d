"""The compile-only check (appliance/evaluation/compile_screen.py, sandbox/harness/compile_check.py), jailed, on the
CPU: what it rejects, what it must never reject, and what a candidate cannot do to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO

triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
pytestmark = pytest.mark.skipif(not PTXAS.is_file(), reason="this Triton build has no CUDA backend (ptxas)")

SOFTMAX = REPO / "benchmarks/tasks/softmax.py"
FIXTURES = REPO / "tests/fixtures/candidates"


def screen(tmp_path, arch=90):
    from appliance.evaluation.compile_screen import CompileScreen
    from sandbox.jail import Jail

    return CompileScreen(Jail(), tmp_path / "screen", arch=arch)


def test_a_candidate_cannot_touch_the_specs_of_the_steps_after_its_own(tmp_path):
    """The build step's spec is written before the candidate's code runs, where the jail mounts it read-only: a
    candidate that swaps it for a link to a file outside the jail (or a FIFO) gets nowhere."""
    from appliance.tasks import load_task

    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    hostile = tmp_path / "hostile.py"
    hostile.write_text((FIXTURES / "builds_only_in_the_interpreter.py").read_text() + f'''
import os, sys
from pathlib import Path
_build_spec = Path(sys.argv[-1]).with_name("build.json")
for _attack in (lambda: _build_spec.unlink(), lambda: os.symlink({str(victim)!r}, _build_spec),
                lambda: os.mkfifo(_build_spec)):
    try:
        _attack()
    except OSError:
        pass
''')
    s = screen(tmp_path)
    rejected = s.screen(load_task(SOFTMAX), hostile)
    assert victim.read_text() == "untouched"
    assert rejected is not None and rejected.verdict == "compile_error", rejected  # and the check still ran


def test_a_host_whose_compiler_does_not_work_checks_nothing_and_rejects_nothing(tmp_path):
    """A known-good kernel that does not build (here: for an architecture this ptxas does not know) turns the screen
    off, rather than rejecting every candidate as compile_error."""
    from appliance.tasks import load_task

    s = screen(tmp_path, arch=1)
    assert s.screen(load_task(SOFTMAX), FIXTURES / "builds_only_in_the_interpreter.py") is None
    assert s.off and "known-good kernel" in s.off


def test_only_the_compilers_own_refusal_counts():
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import PTXASError

    from sandbox.harness.compile_check import refused_by_compiler

    assert refused_by_compiler(CompilationError("def k(): ...", None, "unsupported AST node type: Break"))
    assert refused_by_compiler(PTXASError("`ptxas` failed with error code 1\n`ptxas` stderr:\nerror"))
    assert not refused_by_compiler(PTXASError("`ptxas` failed with error code 137"))  # killed (a limit)
    assert not refused_by_compiler(RuntimeError("Cannot find ptxas"))
    assert not refused_by_compiler(PermissionError("ptxas"))


def test_arguments_it_cannot_type_leave_the_launch_unbuilt_not_rejected():
    import torch

    from sandbox.harness.compile_check import launch_of

    def kernel(desc, out_ptr, n, scale, BLOCK):
        pass

    typed = launch_of(kernel, (torch.zeros(2), torch.zeros(2), 7, 0.5, 64), {})
    assert typed["signature"] == {"desc": "*fp32", "out_ptr": "*fp32", "n": "i32", "scale": "fp32", "BLOCK": "i32"}
    untyped = launch_of(kernel, (object(), torch.zeros(2), 7, 0.5, 64), {})  # a TMA descriptor, say
    assert untyped["untyped"] == "desc: object" and "signature" not in untyped


def test_an_out_of_memory_error_is_retried_alone_only_when_it_could_fit_there(tmp_path):
    from appliance.evaluation.pipeline import EvalSettings, Pipeline
    from sandbox.jail import Jail

    pipeline = Pipeline(Jail(), EvalSettings(device="cpu", jobs_dir=tmp_path))
    pipeline.gate.memory_bytes = 100 << 30
    said = lambda text: {"message": f"CUDA out of memory. {text} (GPU 0; 139.81 GiB total capacity)"}  # noqa: E731
    assert pipeline._could_fit_alone(said("Tried to allocate 20.00 GiB."), 10 << 30)
    assert not pipeline._could_fit_alone(said("Tried to allocate 95.00 GiB."), 10 << 30)  # 95 > 100 - 10
    assert pipeline._could_fit_alone(said("Tried to allocate 512.00 MiB."), 99 << 30)
    assert not pipeline._could_fit_alone(said("Tried to allocate 2048.00 MiB."), 99 << 30)
    assert pipeline._could_fit_alone(said("Tried to allocate 1.2.3 GiB."), 0)  # garbage from the candidate: no crash
    assert pipeline._could_fit_alone({"message": "no size named"}, 0)
    pipeline.gate.memory_bytes = None
    assert pipeline._could_fit_alone(said("Tried to allocate 999.00 GiB."), 0)  # no budget known: as before
