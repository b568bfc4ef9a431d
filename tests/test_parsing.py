"""Every parse of Python source in the appliance goes through appliance/parsing.py (one thread at a time): CPython
3.11 fails with "AST constructor recursion depth mismatch" when threads parse at once, and the loop's evaluation
and proposal threads all parse candidates (a cheap text check that called ast.parse itself failed a loop test)."""

from __future__ import annotations

import re

from tests.conftest import REPO

DIRECT = re.compile(r"\bast\.parse\(|\bcompile\([^)]*PyCF_ONLY_AST|ast\.literal_eval\(\s*(source|text)\b")


def test_no_module_of_the_appliance_parses_outside_parsing_py():
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in (REPO / "appliance").rglob("*.py")
                 if path.name != "parsing.py"
                 for n, line in enumerate(path.read_text().splitlines(), 1) if DIRECT.search(line)]
    assert offenders == []
