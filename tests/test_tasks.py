"""appliance.tasks.load_task on task files written for each test: what loads, what is refused (naming the file
and, where it is known, the line), and what a loaded task says about its shapes, tolerances and work."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from appliance.errors import TaskError
from appliance.tasks import load_task

REPO = Path(__file__).parent.parent
SUITE = REPO / "benchmarks" / "tasks"
BASELINES = REPO / "benchmarks" / "baselines"

# A KernelBench problem file as the format describes it. Line numbers below refer to this text.
VALID = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.softmax(x, dim=-1)


batch_size = 4096
dim = 65536
scale = 0.5
verbose = True
derived = batch_size * 2


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return [dim]
'''


def write_task(tmp_path: Path, source: str = VALID, manifest: str | None = None, name: str = "task") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    if manifest is not None:
        path.with_suffix(".toml").write_text(textwrap.dedent(manifest))
    return path


def load_error(path: Path) -> TaskError:
    with pytest.raises(TaskError) as info:
        load_task(path)
    return info.value


# --- the task file ---


def test_valid_kernelbench_file_loads(tmp_path):
    path = write_task(tmp_path)
    task = load_task(path)
    assert task.name == "task"
    assert task.path == path.resolve() and task.path.is_absolute()
    assert task.source == VALID
    # Only module-level integer literals are sizes: not floats, bools or computed values.
    assert task.sizes == {"batch_size": 4096, "dim": 65536}
    assert task.manifest_path is None and task.manifest_text == ""
    assert task.manifest.seeds == 3 and task.manifest.dtype is None
    assert task.manifest.backends == ["triton", "cuda", "cupy"]
    # Without a manifest: the file's own sizes, then the derived shapes (correctness only), in either mode.
    for mode in ("small", "full"):
        main, *derived = task.shapes(mode)
        assert (main.name, main.sizes, main.layout) == ("main", {"batch_size": 4096, "dim": 65536}, "contiguous")
        assert main.distribution["kind"] == "default" and main.timed
        assert [(d.name, d.sizes, d.distribution["kind"], d.layout, d.timed) for d in derived] == [
            ("odd", {"batch_size": 4607, "dim": 73727}, "default", "contiguous", False),
            ("smaller_scaled", {"batch_size": 1025, "dim": 16385}, "scaled", "contiguous", False),
            ("strided_outliers", {"batch_size": 1025, "dim": 16385}, "outliers", "strided", False),
            ("nonfinite", {"batch_size": 1025, "dim": 16385}, "nonfinite", "contiguous", False),
            ("aligned_padded", {"batch_size": 1040, "dim": 16400}, "default", "padded", False)]
        assert all(d.origin.startswith("derived: ") for d in derived)
    assert task.work(task.sizes) == (None, None)


def test_derived_sizes_keep_small_ints_and_equal_sizes_equal(tmp_path):
    from appliance.tasks import derived_shapes

    odd, small, *_ = derived_shapes({"M": 4096, "K": 4096, "N": 1000, "dim": 1, "kernel_size": 3, "B": 16}, {})
    assert odd.sizes == {"M": 4607, "K": 4607, "N": 1063, "dim": 1, "kernel_size": 3, "B": 17}
    assert small.sizes == {"M": 1025, "K": 1025, "N": 251, "dim": 1, "kernel_size": 3, "B": 5}
    assert all(v % 2 for k, v in odd.sizes.items() if k not in ("dim", "kernel_size"))


def test_derived_widths_are_neither_powers_of_two_nor_multiples_of_a_block():
    from appliance.tasks import aligned_size, odd_size

    for n in (64, 1000, 4096, 8192, 65536):
        odd, aligned = odd_size(n), aligned_size(n)
        assert odd % 2 == 1 and n < odd <= n + n // 8
        assert aligned % 16 == 0 and aligned % 32 != 0  # even, yet no whole number of any block of 32 or more


def test_derived_sizes_are_drawn_in_secret_within_their_rules_and_keep_equal_sizes_equal():
    """Each evaluation draws its own (Pipeline._run): a kernel cannot know the sizes it will be checked at, nor tell
    them from the sizes it could meet anywhere else in the rules' ranges."""
    import os

    from appliance.tasks import aligned_size, derived_shapes, odd_size, secret_draw, smaller_size

    sizes = {"M": 4096, "K": 4096, "N": 1000, "dim": 1}
    draws = [derived_shapes(sizes, {}, os.urandom(16)) for _ in range(20)]
    odd_widths = {d[0].sizes["M"] for d in draws}
    assert len(odd_widths) > 10  # 256 values to draw from: twenty secrets give many
    for odd, small, *_, aligned in draws:
        assert odd.sizes["M"] == odd.sizes["K"] and small.sizes["M"] == small.sizes["K"]  # equal stays equal
        assert aligned.sizes["M"] == aligned.sizes["K"] and odd.sizes["dim"] == 1
    for n in (16, 64, 1000, 4096, 8192, 65536):
        odds, alignments = set(), set()
        for secret in (os.urandom(16) for _ in range(200)):
            draw = secret_draw(secret)
            odd, small, aligned = odd_size(n, draw), smaller_size(n, draw), aligned_size(n, draw)
            assert odd % 2 == 1 and n < odd <= n + n // 8, (n, odd)
            assert small % 2 == 1 and n // 4 <= small <= n // 4 + n // 16 + 1, (n, small)
            assert aligned % 16 == 0 and aligned <= n // 4 + n // 16 + 256, (n, aligned)
            odds.add(odd)
            alignments.add(aligned & -aligned)  # 16, 32, 64 or 128: the largest power of two dividing it
            if n >= 1000:
                assert aligned & (aligned - 1), (n, aligned)  # never a power of two
        if n >= 4096:  # the whole range above n is drawn from, and every alignment
            assert min(odds) < n + n // 32 and max(odds) > n + n // 8 - n // 32, (n, min(odds), max(odds))
            assert alignments == {16, 32, 64, 128}, (n, alignments)
    secret = os.urandom(16)
    assert derived_shapes(sizes, {}, secret)[0].sizes == derived_shapes(sizes, {}, secret)[0].sizes  # one draw


def test_the_gates_layouts_put_rows_further_apart_than_their_width():
    from sandbox.harness.referee import _strides

    assert _strides((4, 100), "contiguous") is None
    assert _strides((4, 100), "strided") == (202, 2)  # a stride-2 view, rows 2 x width + 2 apart
    assert _strides((4, 100), "padded") == (116, 1)  # inner stride 1, rows 16 elements apart more than their width
    assert _strides((3, 4, 100), "padded") == (464, 116, 1)
    assert _strides((100,), "padded") is None  # one row: nothing to pad between


def test_sizes_assigned_together_are_sizes_too(tmp_path):
    path = tmp_path / "pair.py"
    path.write_text(write_task(tmp_path).read_text().replace("batch_size = 4096\ndim = 65536",
                                                             "batch_size, dim = 64, 512"))
    task = load_task(path)
    assert task.sizes == {"batch_size": 64, "dim": 512}
    assert {s.name: s.sizes for s in task.shapes("full")}["odd"] == {"batch_size": 71, "dim": 575}


def test_task_loads_from_a_string_path(tmp_path):
    path = write_task(tmp_path)
    assert load_task(str(path)).sizes == {"batch_size": 4096, "dim": 65536}


def test_missing_task_file(tmp_path):
    err = load_error(tmp_path / "nope.py")
    assert str(tmp_path / "nope.py") in str(err) and "no such task file" in str(err)


def test_syntax_error_names_file_and_line(tmp_path):
    path = write_task(tmp_path, VALID.replace("def forward(self, x):", "def forward(self, x)"))
    err = load_error(path)
    assert err.line == 10
    assert f"{path}:10" in str(err) and "syntax error" in str(err)


def test_no_class_model(tmp_path):
    path = write_task(tmp_path, VALID.replace("class Model(", "class Net("))
    err = load_error(path)
    assert str(path) in str(err) and "class Model" in str(err)


def test_model_that_is_not_a_class_is_refused(tmp_path):
    source = VALID.replace("class Model(", "class Net(") + "\nModel = Net\n"
    err = load_error(write_task(tmp_path, source))
    assert "class Model" in str(err)


def test_model_without_forward_names_the_class_line(tmp_path):
    path = write_task(tmp_path, VALID.replace("def forward(self, x):", "def run(self, x):"))
    err = load_error(path)
    assert err.line == 5  # the `class Model` line
    assert f"{path}:5" in str(err) and "forward()" in str(err)


@pytest.mark.parametrize("fn", ["get_inputs", "get_init_inputs"])
def test_missing_input_function(tmp_path, fn):
    path = write_task(tmp_path, VALID.replace(f"def {fn}():", f"def make_{fn}():"))
    err = load_error(path)
    assert str(path) in str(err) and f"def {fn}()" in str(err)


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        ("def get_inputs():", "def get_inputs(n):", 21),
        ("def get_inputs():", "def get_inputs(*, n):", 21),
        ("def get_init_inputs():", "def get_init_inputs(dim, scale=1):", 25),
    ],
)
def test_input_function_with_required_argument_names_its_line(tmp_path, old, new, line):
    path = write_task(tmp_path, VALID.replace(old, new))
    err = load_error(path)
    assert err.line == line
    assert f"{path}:{line}" in str(err) and "no required arguments" in str(err)


def test_input_functions_with_only_optional_arguments_load(tmp_path):
    source = VALID.replace("def get_inputs():", "def get_inputs(n=2, *args, seed=0, **kw):")
    assert load_task(write_task(tmp_path, source)).name == "task"


# --- the manifest ---


def test_invalid_toml_names_manifest_and_line(tmp_path):
    path = write_task(tmp_path, manifest='description = "x"\nseeds = = 3\n')
    err = load_error(path)
    assert str(path.with_suffix(".toml")) in str(err)
    assert "invalid TOML" in str(err) and "line 2" in str(err)


def test_unknown_manifest_key_is_named_with_its_line(tmp_path):
    path = write_task(tmp_path, manifest='description = "x"\ncolour = "blue"\n')
    err = load_error(path)
    assert err.line == 2
    assert f"{path.with_suffix('.toml')}:2" in str(err) and "colour" in str(err)


def test_unknown_key_inside_a_shape(tmp_path):
    manifest = '[[shapes]]\nname = "a"\nsizes = { dim = 3 }\nlayuot = "strided"\n'
    err = load_error(write_task(tmp_path, manifest=manifest))
    assert err.line == 4 and "layuot" in str(err)


def test_bad_dtype_value(tmp_path):
    err = load_error(write_task(tmp_path, manifest='description = "x"\ndtype = "float8"\n'))
    assert err.line == 2 and "dtype" in str(err) and "float32" in str(err)


@pytest.mark.parametrize(
    ("manifest", "word"),
    [
        ('distribution = "gaussian"', "distribution"),
        ('backends = ["triton", "opencl"]', "backends"),
        ("seeds = 0", "seeds"),
        ('[[shapes]]\nname = "a"\nlayout = "diagonal"', "layout"),
        ('[[shapes]]\nname = "a"\nmodes = ["tiny"]', "modes"),
        ('distribution = { kind = "outliers", fraction = 0 }', "fraction"),
        ("[tolerance.float32]\natol = -1\nrtol = 0", "atol"),
    ],
)
def test_bad_manifest_values_are_refused(tmp_path, manifest, word):
    path = write_task(tmp_path, manifest=manifest + "\n")
    err = load_error(path)
    assert str(path.with_suffix(".toml")) in str(err) and word in str(err)


def test_tolerance_for_unknown_dtype(tmp_path):
    manifest = "[tolerance.float8]\natol = 1e-3\nrtol = 1e-3\n"
    err = load_error(write_task(tmp_path, manifest=manifest))
    assert "tolerance" in str(err) and "float8" in str(err) and "float32" in str(err)


@pytest.mark.parametrize(
    ("manifest", "label", "line"),
    [
        ('description = "x"\n\n[small]\nsizes = { batch_size = 2, rows = 3 }\n', "small.sizes", 4),
        ('description = "x"\n[[shapes]]\nname = "odd"\nsizes = { dim = 3, rows = 5 }\n', "shapes[odd].sizes", 4),
    ],
)
def test_size_key_that_is_not_a_module_size(tmp_path, manifest, label, line):
    path = write_task(tmp_path, manifest=manifest)
    err = load_error(path)
    assert err.line == line
    text = str(err)
    assert f"{path.with_suffix('.toml')}:{line}" in text and label in text and "'rows'" in text
    assert "batch_size" in text and "dim" in text  # the known sizes


def test_unknown_size_key_line_ignores_other_mentions_of_the_word(tmp_path):
    manifest = 'description = "Softmax over rows"\n\n[small]\nsizes = { batch_size = 2, rows = 3 }\n'
    err = load_error(write_task(tmp_path, manifest=manifest))
    assert err.line == 4, str(err)


@pytest.mark.parametrize(
    "manifest",
    [
        '[[shapes]]\nname = "a"\n[[shapes]]\nname = "a"\n',
        '[[shapes]]\nname = "main"\nsizes = { dim = 3 }\n',
    ],
    ids=["duplicate", "main"],
)
def test_shape_names_must_be_unique_and_not_main(tmp_path, manifest):
    path = write_task(tmp_path, manifest=manifest)
    err = load_error(path)
    assert str(path.with_suffix(".toml")) in str(err) and "unique" in str(err) and "'main'" in str(err)


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("2 * batch_size * n", ["unknown size 'n'"]),
        ("__import__('os')", ["only numbers, sizes"]),
        ("batch_size.bit_length()", ["only numbers, sizes"]),
        ("'a' * batch_size", ["only numbers, sizes"]),
        ("batch_size *", ["not valid arithmetic"]),
    ],
)
@pytest.mark.parametrize("key", ["flops", "bytes"])
def test_bad_work_expression(tmp_path, key, expr, words):
    path = write_task(tmp_path, manifest=f'{key} = "{expr}"\n')
    err = load_error(path)
    assert str(path.with_suffix(".toml")) in str(err) and expr in str(err)
    for word in words:
        assert word in str(err)


def test_work_expression_dividing_by_zero_is_a_task_error(tmp_path):
    err = load_error(write_task(tmp_path, manifest='flops = "batch_size / (dim - dim)"\n'))
    assert "flops" in str(err) or "batch_size / (dim - dim)" in str(err)


# --- what a loaded task says ---

MANIFEST = '''\
description = "Row softmax"
distribution = "randn"
flops = "5 * batch_size * dim"
bytes = "2 * 4 * batch_size * dim // 2 ** 1"

[tolerance.float32]
atol = 1e-5
rtol = 2e-5

[small]
sizes = { dim = 300 }

[[shapes]]
name = "odd"
sizes = { batch_size = 3, dim = 4097 }
distribution = { kind = "outliers", fraction = 0.01, scale = 50.0 }
layout = "strided"

[[shapes]]
name = "big"
sizes = { batch_size = 8192 }
modes = ["full"]

[[shapes]]
name = "tiny"
sizes = { batch_size = 1, dim = 1 }
distribution = "uniform"
modes = ["small"]
'''


@pytest.fixture
def task(tmp_path):
    return load_task(write_task(tmp_path, manifest=MANIFEST))


def test_manifest_is_kept_with_the_task(task, tmp_path):
    assert task.manifest_path == (tmp_path / "task.toml").resolve()
    assert task.manifest_text == MANIFEST
    assert task.manifest.description == "Row softmax"


def test_small_shapes(task):
    shapes = task.shapes("small")
    assert [s.name for s in shapes] == ["main", "odd", "tiny"]  # main first, "big" is full-only
    main, odd, tiny = shapes
    # [small].sizes override the file's sizes for the main shape only; unnamed sizes keep the file's value.
    assert main.sizes == {"batch_size": 4096, "dim": 300}
    assert main.layout == "contiguous"
    assert main.distribution == {"kind": "randn", "scale": 100.0, "fraction": 0.001}
    assert odd.sizes == {"batch_size": 3, "dim": 4097}
    assert odd.layout == "strided"
    assert odd.distribution == {"kind": "outliers", "scale": 50.0, "fraction": 0.01}
    assert tiny.sizes == {"batch_size": 1, "dim": 1}
    assert tiny.distribution["kind"] == "uniform" and tiny.layout == "contiguous"


def test_full_shapes(task):
    shapes = task.shapes("full")
    assert [s.name for s in shapes] == ["main", "odd", "big"]
    main, odd, big = shapes
    assert main.sizes == {"batch_size": 4096, "dim": 65536}
    assert odd.sizes == {"batch_size": 3, "dim": 4097}
    # A shape without its own distribution inherits the manifest's; partial sizes keep the file's others.
    assert big.sizes == {"batch_size": 8192, "dim": 65536}
    assert big.distribution["kind"] == "randn"


def test_shapes_do_not_share_size_dicts(task):
    main = task.shapes("small")[0]
    main.sizes["dim"] = 1
    assert task.shapes("small")[0].sizes["dim"] == 300
    assert task.sizes == {"batch_size": 4096, "dim": 65536}


def test_without_a_manifest_no_tolerance_is_explicit(tmp_path):
    """Every dtype is then checked against the precision the task's own Model reaches (tests/evaluation/
    test_compare.py): no absolute tolerance that could exceed the outputs themselves."""
    assert load_task(write_task(tmp_path)).tolerances() == {}


def test_a_manifest_tolerance_is_explicit_for_its_dtype_only(task):
    tol = task.tolerances()
    assert tol == {"float32": {"atol": 1e-5, "rtol": 2e-5}}


def test_work_per_shape_sizes(task):
    for shape in task.shapes("small") + task.shapes("full"):
        b, d = shape.sizes["batch_size"], shape.sizes["dim"]
        flops, nbytes = task.work(shape.sizes)
        assert flops == 5 * b * d and isinstance(flops, float)
        assert nbytes == 4 * b * d and isinstance(nbytes, float)
    assert task.work({"batch_size": 3, "dim": 7}) == (105.0, 84.0)


def test_work_with_only_flops(tmp_path):
    t = load_task(write_task(tmp_path, manifest='flops = "2 * batch_size * dim / 4"\n'))
    assert t.work({"batch_size": 2, "dim": 10}) == (10.0, None)


# --- the bundled suite ---

SUITE_TASKS = sorted(SUITE.glob("*.py"))


def test_suite_is_there():
    assert len(SUITE_TASKS) >= 12


@pytest.mark.parametrize("path", SUITE_TASKS, ids=lambda p: p.stem)
def test_bundled_task_loads_and_is_complete(path):
    task = load_task(path)
    assert (BASELINES / path.name).is_file(), f"no baseline for {path.name}"
    assert task.manifest_path is not None and task.manifest.description.strip()
    assert task.manifest.small.sizes, "no [small] sizes: CPU evaluation would use the full sizes"
    assert set(task.manifest.small.sizes) <= set(task.sizes)
    assert task.manifest.shapes, "no extra shape"
    small = task.shapes("small")
    assert small[0].name == "main" and len(small) >= 2
    for shape in small + task.shapes("full"):
        flops, nbytes = task.work(shape.sizes)
        assert flops is None or flops > 0
        assert nbytes is None or nbytes > 0
