"""Torch's headers precompiled by trusted code for load_inline builds (sandbox/builds.py): a jailed candidate
builds beside them and cannot delete or poison them for the candidates after it.

On a GPU host the worker builds the real header (about 750 MiB, 40 s or more of a core) before the first
load_inline candidate; the GPU tests and benchmarks/build_speed.py exercise that. Here, where it would only cost CI
minutes, a stand-in file sits where the header goes (GCC ignores a file that is not a valid precompiled header), and
what is tested is that the jail leaves it as it was and the build reaches the compiler: the candidate's source
does not compile, so its verdict is compile_error (without the fix, torch's own delete failed first)."""

from __future__ import annotations

import hashlib

import pytest

from sandbox.builds import build_lock_path, pch_paths
from tests.conftest import FIXTURES


@pytest.mark.slow
def test_a_jailed_build_beside_the_trusted_header_cannot_change_it(appliance, softmax_task, tmp_path):
    gch, sign = pch_paths()
    build_lock_path().touch()  # the workers' lock exists on the host: the candidate must not reach it
    made = [p for p in (gch, sign) if not p.exists()]
    for p in made:
        p.write_bytes(b"stand-in for the trusted precompiled header")
    try:
        before = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (gch, sign)]
        task = tmp_path / "rowsoftmax.py"  # a copy of the fixture task that allows load_inline (backend "cuda")
        task.write_text(softmax_task.read_text())
        manifest = softmax_task.with_suffix(".toml").read_text().replace('backends = ["triton"]',
                                                                          'backends = ["cuda"]')
        task.with_suffix(".toml").write_text(manifest)
        code, result = appliance.eval_json(task, FIXTURES / "candidates" / "inline_cpp_pch_tamper.py")
        assert (result["verdict"], result["stage"]) == ("compile_error", "compile"), result["reason"]
        assert "Error building extension" in result["reason"]
        # neither deleted nor overwritten from the jail, by the candidate or by torch's own load_inline
        assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in (gch, sign)] == before
    finally:
        for p in made:
            p.unlink(missing_ok=True)
