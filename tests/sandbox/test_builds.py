"""Torch's headers precompiled by trusted code for load_inline builds (sandbox/builds.py): a jailed candidate's
build uses them, and cannot delete or poison them for the candidates after it."""

from __future__ import annotations

import hashlib

import pytest

from sandbox.builds import ensure_torch_pch, pch_paths
from tests.conftest import FIXTURES


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_jailed_build_uses_the_trusted_header_and_cannot_change_it(appliance, softmax_task, tmp_path):
    status = ensure_torch_pch()
    if status.startswith("skipped"):
        pytest.skip(status)
    gch, sign = pch_paths()
    before = _digest(gch), sign.read_text()
    task = tmp_path / "rowsoftmax.py"  # a copy of the fixture task that allows load_inline (backend "cuda")
    task.write_text(softmax_task.read_text())
    manifest = softmax_task.with_suffix(".toml").read_text().replace('backends = ["triton"]', 'backends = ["cuda"]')
    task.with_suffix(".toml").write_text(manifest)
    code, result = appliance.eval_json(task, FIXTURES / "candidates" / "inline_cpp_pch_tamper.py")
    assert code == 0, result["reason"]
    assert result["precompiled_headers"] == "ready", result.get("precompiled_headers")
    assert (_digest(gch), sign.read_text()) == before  # neither deleted nor overwritten from the jail
