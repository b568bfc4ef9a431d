"""The bundled baselines' Triton kernels, at every value of every tunable, build for the H200 (sm_90) without
spilling registers: checked on the CPU with Triton's own ptxas (tests/hopper_compile.py), so a variant the tuner
would propose that cannot compile on the GPU fails here rather than in the GPU session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.proposers.tune import current_values, read_tunables, with_values
from tests.conftest import REPO

triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
pytestmark = pytest.mark.skipif(not PTXAS.is_file(), reason="this Triton build has no CUDA backend (ptxas)")


def variants(source: str) -> list[str]:
    """The baseline as it is, and each tunable at each of its other values (the tuner's one-step moves and more)."""
    current = current_values(source)
    return [source] + [with_values(source, {name: v}) for name, values in read_tunables(source).items()
                       for v in values if v != current[name]]


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
def test_every_tunable_value_of_the_baseline_compiles_for_hopper(name, tmp_path):
    task = REPO / "benchmarks/tasks" / f"{name}.py"
    paths = []
    for i, variant in enumerate(variants((REPO / "benchmarks/baselines" / f"{name}.py").read_text())):
        paths.append(tmp_path / f"{name}_{i}.py")
        paths[-1].write_text(variant)
    recorded = tmp_path / "launches.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "tests.hopper_compile", "record", str(task), str(recorded), *map(str, paths)],
                   env=env | {"TRITON_INTERPRET": "1"}, cwd=REPO, check=True, capture_output=True)
    # Paths the CPU run cannot take (rows walked by a few programs per SM need a GPU to count SMs): the default's
    # launches again with each boolean constexpr flipped, so every branch of the kernel is built.
    launches = json.loads(recorded.read_text())
    recorded.write_text(json.dumps(launches + [
        launch | {"constexprs": launch["constexprs"] | {name: not value}, "flipped": name}
        for launch in launches if launch["candidate"] == str(paths[0])
        for name, value in launch["constexprs"].items() if isinstance(value, bool)]
        + gpu_only_launches(name, paths[0])))
    built = subprocess.run([sys.executable, "-m", "tests.hopper_compile", "compile", str(recorded)], env=env, cwd=REPO,
                           capture_output=True, text=True)
    assert built.returncode == 0, f"a {name} variant does not build for sm_90:\n{built.stderr[-3000:]}"
    launches = json.loads(built.stdout)
    assert {launch["candidate"] for launch in launches} == set(map(str, paths))  # every variant launched a kernel
    # Some corners spill (a 32768-wide block on 8 warps): slow, which the tuner measures. The default must not.
    assert all(launch["stack"] == 0 for launch in launches if launch["candidate"] == str(paths[0])
               and "flipped" not in launch)
    if name == "softmax":
        assert any(launch.get("flipped") == "WALK_ROWS" for launch in launches)
        parts = [launch for launch in launches if launch["kernel"] == "_softmax_parts_kernel"]
        # 32 values or fewer per thread (the fastest measured: 8192 columns on 8 warps) must not spill.
        assert parts and all(launch["stack"] == 0 for launch in parts
                             if launch["constexprs"]["BLOCK"] <= 32 * 32 * launch["options"]["num_warps"])


def gpu_only_launches(name: str, path: Path) -> list[dict]:
    """Launches only a GPU makes, written out by hand: softmax's rows split into parts wait for the other programs of
    their row, which the interpreter (one program at a time) never runs. At the task's row length (65536), a row
    has 65536 / PART_BLOCK parts."""
    if name != "softmax":
        return []
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "stats_ptr": "*fp32", "arrived_ptr": "*i32", "n_cols": "i32",
                 "n_parts": "i32", "stride_xr": "i32", "stride_xc": "i32", "stride_yr": "i32", "BLOCK": "constexpr",
                 "PARTS_P2": "constexpr"}
    return [{"candidate": str(path), "kernel": "_softmax_parts_kernel", "signature": signature,
             "constexprs": {"BLOCK": block, "PARTS_P2": 65536 // block}, "options": {"num_warps": warps}}
            for block in (2048, 4096, 8192, 16384) for warps in (4, 8, 16, 32)]
