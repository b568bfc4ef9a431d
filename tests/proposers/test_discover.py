"""The tuner's discovery of launch parameters in a Triton candidate that declares no TUNABLES: what it lifts, what it
leaves, that the rewrite keeps every other byte and still runs (a real kernel in Triton's interpreter), and that
the tuner then proposes settings of it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest

from appliance.proposers.base import Example, PromptContext
from appliance.proposers.discover import discover
from appliance.proposers.tune import TuneProposer, current_values, read_tunables
from tests.conftest import REPO, candidate

GOOD = candidate("good").read_text()  # BLOCK = next_power_of_2(n): a row-covering block, no launch options


def kernel_module(launches: str, decorators: str = "@triton.jit") -> str:
    return textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl

        ROWS = 256


        {decorators}
        def k(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr, ACT: tl.constexpr, WIDTH: tl.constexpr):
            pass


        def f(x, y, n, **options):
        {launches}
        ''').format(decorators=decorators, launches=textwrap.indent(textwrap.dedent(launches), "    "))


def test_launch_options_a_kernel_left_at_their_defaults_are_written_out_as_tunables():
    rewritten, found = discover(GOOD)
    assert {(f.keyword, f.value) for f in found} == {("num_warps", 4), ("num_stages", 3)}
    tunables = read_tunables(rewritten)
    assert tunables == {"NUM_WARPS_SOFTMAX_KERNEL": [1, 2, 4, 8, 16, 32], "NUM_STAGES_SOFTMAX_KERNEL": [1, 2, 3, 4, 5]}
    assert current_values(rewritten) == {"NUM_WARPS_SOFTMAX_KERNEL": 4, "NUM_STAGES_SOFTMAX_KERNEL": 3}
    # The row-covering block is computed, not a literal: left as it was.
    assert "BLOCK=triton.next_power_of_2(x.shape[1])" in rewritten
    # Every other byte is the original's: take out what was inserted and the source is back.
    header = rewritten[rewritten.index("\n# Launch parameters"):rewritten.index("TUNABLES = ")]
    restored = (rewritten.replace(header, "").replace(rewritten[rewritten.index("TUNABLES = "):].split("\n")[0] + "\n",
                                                      "", 1)
                .replace(", num_stages=NUM_STAGES_SOFTMAX_KERNEL", "").replace(", num_warps=NUM_WARPS_SOFTMAX_KERNEL", ""))
    assert restored == GOOD


def test_block_size_literals_are_lifted_with_a_power_of_two_ladder_and_other_constants_are_left_alone():
    source = kernel_module("""\
        k[(4,)](x, y, n, BLOCK_SIZE=1024, ACT=1, WIDTH=64, num_warps=8)
        k[(4,)](x, y, n, BLOCK_SIZE=96, ACT=2, WIDTH=64, num_warps=8)
        k[(4,)](x, y, n, BLOCK_SIZE=ROWS, ACT=1, WIDTH=64, num_stages=2)
    """)
    rewritten, found = discover(source)
    tunables = read_tunables(rewritten)
    assert tunables["BLOCK_SIZE_K"] == [256, 512, 1024, 2048, 4096]
    assert tunables["ROWS"] == [64, 128, 256, 512, 1024]  # a module constant a launch reads: declared as it is
    assert tunables["NUM_WARPS_K"] == [1, 2, 4, 8, 16, 32] and current_values(rewritten)["NUM_WARPS_K"] == 8
    # 96 is no power of two (likely part of what the launch computes), ACT is no block size, WIDTH is not named
    # like one: none of them is touched.
    assert "BLOCK_SIZE=96, ACT=2, WIDTH=64" in rewritten and "ACT=1, WIDTH=64" in rewritten
    # Launches that gave a kernel different values get constants of their own (here num_warps 8 and the default 4).
    assert current_values(rewritten)["NUM_WARPS_K_2"] == 4


def test_odd_call_layouts_stay_valid_python():
    source = kernel_module("""\
        k[(4,)](
            x, y, n,
            BLOCK_SIZE=512, ACT=1, WIDTH=8,
        )
        k[(4,)](x, y, n, BLOCK_SIZE=512, ACT=1, WIDTH=8  # a comment before the parenthesis
        )
        k[(4,)](x, y, n, BLOCK_SIZE=512, ACT=1, WIDTH=8, **options)
    """)
    rewritten, _ = discover(source)
    compile(rewritten, "rewritten", "exec")
    assert "**options)" in rewritten  # options may carry num_warps: nothing added to that launch


@pytest.mark.parametrize("source", [
    (REPO / "benchmarks/baselines/softmax.py").read_text(),  # declares TUNABLES: the author's choice
    kernel_module("k[(4,)](x, y, n, BLOCK_SIZE=512, ACT=1, WIDTH=8)",
                  "@triton.autotune(configs=[], key=['n'])\n@triton.jit"),  # chooses its own launch parameters
    "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.exp()\n",  # no kernel
    "def broken(:\n",  # not Python
    "x = " + "(" * 5000 + ")" * 5000 + "\n",  # too deep for the parser
], ids=["declared", "autotuned", "no_kernel", "syntax_error", "too_deep"])
def test_nothing_is_discovered_where_there_is_nothing_to_lift_or_the_source_is_hostile(source):
    assert discover(source) is None


def test_the_tuner_proposes_settings_of_a_kernel_that_declares_none():
    tuner = TuneProposer(random.Random(0))
    assert tuner.accepts(GOOD) and not tuner.accepts("import torch\n")
    ctx = PromptContext(task_name="softmax", task_source="", parent=Example(GOOD))
    proposals = tuner.propose(ctx, 3, seen=set())
    assert len(proposals) == 3 and all(p.source for p in proposals), proposals
    assert all(p.note.startswith("launch parameters found: NUM_WARPS_SOFTMAX_KERNEL") for p in proposals)
    assert all(read_tunables(p.source) for p in proposals)  # the children declare them: the run tunes on from there
    assert all(current_values(p.source) != {"NUM_WARPS_SOFTMAX_KERNEL": 4, "NUM_STAGES_SOFTMAX_KERNEL": 3}
               for p in proposals)


def test_a_discovered_setting_runs_and_computes_what_the_original_did(tmp_path):
    """Our own fixture (trusted), run in Triton's interpreter: the original and a variant with other launch
    settings give the same softmax."""
    rewritten, _ = discover(GOOD)
    variant = rewritten.replace("NUM_WARPS_SOFTMAX_KERNEL = 4", "NUM_WARPS_SOFTMAX_KERNEL = 16").replace(
        "NUM_STAGES_SOFTMAX_KERNEL = 3", "NUM_STAGES_SOFTMAX_KERNEL = 1")
    (tmp_path / "original.py").write_text(GOOD)
    (tmp_path / "variant.py").write_text(variant)
    check = ("import torch, original, variant\n"
             "x = torch.randn(5, 37)\n"
             "a, b = original.ModelNew()(x), variant.ModelNew()(x)\n"
             "assert torch.equal(a, b) and torch.allclose(a, torch.softmax(x, -1), atol=1e-6), (a - b).abs().max()\n"
             "print('same')\n")
    result = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env=os.environ | {"TRITON_INTERPRET": "1"})
    assert result.returncode == 0 and "same" in result.stdout, result.stderr[-2000:]


def test_a_block_size_the_grid_also_spells_out_is_left_alone():
    """Lifting BLOCK_SIZE=1024 while the grid keeps cdiv(n, 1024) would launch too few or too many programs at
    every other value: each such proposal a wasted evaluation."""
    rewritten, found = discover(kernel_module("""\
        k[(triton.cdiv(n, 1024),)](x, y, n, BLOCK_SIZE=1024, ACT=1, WIDTH=64, num_warps=8)"""))
    assert "BLOCK_SIZE" not in {f.keyword for f in found}
    assert "BLOCK_SIZE=1024" in rewritten and "num_warps=NUM_WARPS_K" in rewritten


def test_new_constants_shadow_no_name_of_the_source():
    """A parameter, function or import named like the constant the tuner would write stays what it was."""
    source = kernel_module("""\
        import math as NUM_WARPS_K  # a name the rewrite must not shadow (an import alias is no ast.Name)
        k[(ROWS,)](x, y, n, BLOCK_SIZE=512, ACT=1, WIDTH=64, num_warps=8)""")
    rewritten, found = discover(source)
    warps = [f.constant for f in found if f.keyword == "num_warps"]
    assert warps == ["NUM_WARPS_K_2"], warps
    assert "num_warps=NUM_WARPS_K_2" in rewritten

