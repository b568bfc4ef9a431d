"""The text checks before anything is prepared (appliance/evaluation/static_checks.py): what they reject, and the
honest or undecidable modules they must leave to the jail (a false rejection here would cost a good kernel)."""

from __future__ import annotations

import pytest

from appliance.evaluation.static_checks import MAX_PARSED_BYTES, static_rejection
from tests.conftest import FIXTURES

TASK = (FIXTURES / "tasks" / "rowsoftmax.py").read_text()  # Model() and forward(self, x)

REJECTED = {
    "syntax": ("def (", "syntax error at line 1"),
    "no ModelNew": ("x = 1", "no class ModelNew"),
    "forward of two": ("class ModelNew:\n    def forward(self, a, b): pass", "ModelNew.forward takes 2"),
    "constructor of one": ("class ModelNew:\n    def __init__(self, dim): pass", "ModelNew.__init__ takes 1"),
    "keyword-only": ("class ModelNew:\n    def forward(self, x, *, scale): pass", "keyword-only"),
}

LEFT_TO_THE_JAIL = {  # ModelNew may exist, or take the inputs, in ways text cannot tell
    "globals": 'globals()["ModelNew"] = object',
    "walrus": "(ModelNew := object)",
    "match": "match 1:\n    case 1:\n        class ModelNew: pass",
    "conditional": "if True:\n    class ModelNew: pass",
    "star import": "from os import *",
    "module getattr": "def __getattr__(name): return object",
    "imported": "from elsewhere import ModelNew",
    "class decorator": "import functools\n@functools.total_ordering\nclass ModelNew:\n    def forward(self, a, b): pass",
    "forward assigned": "class ModelNew:\n    def _f(self, a, b): pass\n    forward = _f",
    "own __call__": "class ModelNew:\n    def __call__(self, *a): pass\n    def forward(self, a, b): pass",
    "varargs": "class ModelNew:\n    def forward(self, *inputs): pass",
    "defaults": "class ModelNew:\n    def forward(self, x, y=None): pass",
    "subclass": "class Model: pass\nclass ModelNew(Model): pass",
    "huge": "x = [" + "1," * MAX_PARSED_BYTES + "]\nclass ModelNew: pass",  # not parsed here at all
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_what_the_text_shows_cannot_work_is_rejected_with_why(name):
    source, words = REJECTED[name]
    rejection = static_rejection(source, TASK)
    assert rejection is not None and rejection.verdict == "load_error" and rejection.check == "static"
    assert words in rejection.reason, rejection.reason


@pytest.mark.parametrize("name", sorted(LEFT_TO_THE_JAIL))
def test_what_the_text_cannot_decide_is_left_to_the_jail(name):
    assert static_rejection(LEFT_TO_THE_JAIL[name], TASK) is None


def test_every_honest_fixture_passes_the_text_checks():
    for path in (FIXTURES / "candidates").glob("*.py"):
        if path.stem not in ("syntax_error", "no_modelnew", "wrong_forward_arity"):
            assert static_rejection(path.read_text(), TASK) is None, path.name
