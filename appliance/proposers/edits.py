"""Turning an LLM reply into a candidate source: SEARCH/REPLACE edits of the parent, or a full rewrite in a code block.

Everything here is a pure function of text. A reply that cannot become a candidate raises EditError, whose message
is short and specific because the proposer records it and feeds it back to the model on the next attempt.
"""

from __future__ import annotations

import ast
import hashlib
import re
import textwrap

from appliance import parsing

MAX_SOURCE_BYTES = 200_000
PYTHON_FENCE_LANGS = ("", "python", "py", "python3")

# Models vary the marker length and indent the markers inside lists; aider accepts 5-9 marker characters too.
SEARCH_RE = re.compile(r"^\s*<{5,9} ?SEARCH\s*$")
DIVIDER_RE = re.compile(r"^\s*={5,9}\s*$")
REPLACE_RE = re.compile(r"^\s*>{5,9} ?REPLACE\s*$")
FENCE_OPEN_RE = re.compile(r"^\s*(`{3,})\s*([\w+.-]*)[^`]*$")
FENCE_CLOSE_RE = re.compile(r"^\s*(`{3,})\s*$")
# A regex, not ast: a block that defines ModelNew but does not parse should report its syntax error.
MODELNEW_RE = re.compile(r"^class\s+ModelNew\b", re.MULTILINE)


class EditError(ValueError):
    """Why a reply could not become a candidate (message is specific and short, fed back to the LLM)."""


def apply_reply(parent_source: str, reply: str) -> tuple[str, str]:
    """Return (new_source, mode) with mode "diff" or "rewrite", or raise EditError."""
    if not reply or not reply.strip():  # the OpenAI API can return content None
        raise EditError("reply is empty")
    parent = parent_source.replace("\r\n", "\n")
    lines = reply.replace("\r\n", "\n").split("\n")
    if any(SEARCH_RE.match(line) for line in lines):
        source, mode = _apply_blocks(parent, _parse_blocks(lines)), "diff"
    else:
        source, mode = _pick_rewrite(lines), "rewrite"
    _validate(source)
    if normalize_source(source) == normalize_source(parent):
        raise EditError("edit leaves the source unchanged" if mode == "diff" else "rewrite is identical to the parent")
    return source, mode


def normalize_source(source: str) -> str:
    """Canonical form used to detect duplicate candidates: the ast unparsed without comments, formatting or docstrings;
    whitespace-collapsed text when the source does not parse."""
    try:
        tree = parsing.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return " ".join(source.split())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and _has_docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def source_hash(source: str) -> str:
    return hashlib.sha256(normalize_source(source).encode("utf-8", "surrogatepass")).hexdigest()


def _has_docstring(node: ast.AST) -> bool:
    first = node.body[0] if node.body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def _parse_blocks(lines: list[str]) -> list[tuple[list[str], list[str]]]:
    blocks: list[tuple[list[str], list[str]]] = []
    state, search, replace = None, [], []
    for line in lines:
        n = len(blocks) + 1
        if state is None:
            if SEARCH_RE.match(line):
                state, search, replace = "search", [], []
        elif state == "search":
            if DIVIDER_RE.match(line):
                state = "replace"
            elif SEARCH_RE.match(line) or REPLACE_RE.match(line):
                raise EditError(f"edit block {n} is malformed: expected ======= before {line.strip()!r}")
            else:
                search.append(line)
        elif REPLACE_RE.match(line):
            blocks.append((search, replace))
            state = None
        elif SEARCH_RE.match(line):
            raise EditError(f"edit block {n} is malformed: new SEARCH before >>>>>>> REPLACE")
        else:
            replace.append(line)
    if state == "search":
        raise EditError(f"reply truncated: edit block {len(blocks) + 1} has no ======= line")
    if state == "replace":
        raise EditError(f"reply truncated: edit block {len(blocks) + 1} has no >>>>>>> REPLACE line")
    return blocks


def _apply_blocks(source: str, blocks: list[tuple[list[str], list[str]]]) -> str:
    lines = source.split("\n")
    for n, (search, replace) in enumerate(blocks, 1):
        if not any(line.strip() for line in search):
            raise EditError(f"edit block {n} has an empty SEARCH section")
        first = next(line.strip() for line in search if line.strip())[:80]
        starts = _find_exact(lines, search)
        if not starts:
            search, replace = _trim_blank_edges(search), _trim_blank_edges(replace)
            starts = _find_loose(lines, search)
            if len(starts) == 1:
                replace = _reindent(replace, _indent(lines[starts[0] : starts[0] + len(search)]) - _indent(search))
        if len(starts) == 1:
            lines[starts[0] : starts[0] + len(search)] = replace
            continue
        # Last resort for a SEARCH that quotes part of a line ("tl.maximum(x, 0.0)"): an exact substring.
        text, fragment = "\n".join(lines), "\n".join(search)
        count = len(starts) or text.count(fragment)
        if count == 0:
            raise EditError(f"edit block {n}: SEARCH text not found in the source (first line: {first!r})")
        if count > 1:
            raise EditError(
                f"edit block {n}: SEARCH text matches {count} places; add lines to make it unique "
                f"(first line: {first!r})"
            )
        lines = text.replace(fragment, "\n".join(replace)).split("\n")
    return "\n".join(lines)


def _find_exact(lines: list[str], search: list[str]) -> list[int]:
    k = len(search)
    return [i for i in range(len(lines) - k + 1) if lines[i : i + k] == search]


def _find_loose(lines: list[str], search: list[str]) -> list[int]:
    """Matches ignoring trailing whitespace and a uniform indentation shift: models often re-indent a method
    they copy out of a class, or drop the trailing spaces of the parent."""
    want = _dedented(search)
    k = len(search)
    return [i for i in range(len(lines) - k + 1) if _dedented(lines[i : i + k]) == want]


def _dedented(lines: list[str]) -> list[str]:
    cut = _indent(lines)
    return [line.rstrip()[cut:] for line in lines]


def _indent(lines: list[str]) -> int:
    return min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)


def _reindent(lines: list[str], shift: int) -> list[str]:
    if shift >= 0:
        return [" " * shift + line if line.strip() else line for line in lines]
    return [line[min(-shift, len(line) - len(line.lstrip())) :] for line in lines]


def _trim_blank_edges(lines: list[str]) -> list[str]:
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return lines[start:end]


def _pick_rewrite(lines: list[str]) -> str:
    blocks = _code_blocks(lines)
    if not blocks:
        raise EditError("reply has no code block and no SEARCH/REPLACE edit")
    defining = [code for lang, code in blocks if lang in PYTHON_FENCE_LANGS and MODELNEW_RE.search(code)]
    if not defining:
        raise EditError("no code block defines class ModelNew")
    # The last one: models often show a draft first and the corrected version after it.
    return defining[-1]


def _code_blocks(lines: list[str]) -> list[tuple[str, str]]:
    """(language, code) of each fenced block. A closing fence needs at least the opening's backticks, so a block
    can quote a shorter fence (CommonMark's rule)."""
    blocks, opened = [], None
    for lineno, line in enumerate(lines, 1):
        if opened is None:
            m = FENCE_OPEN_RE.match(line)
            if m:
                opened, ticks, lang, body = lineno, len(m.group(1)), m.group(2).lower(), []
        else:
            m = FENCE_CLOSE_RE.match(line)
            if m and len(m.group(1)) >= ticks:
                blocks.append((lang, textwrap.dedent("\n".join(body)).strip("\n") + "\n"))
                opened = None
            else:
                body.append(line)
    if opened is not None:
        raise EditError(f"reply truncated: code block opened at line {opened} is never closed")
    return blocks


def _validate(source: str) -> None:
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        raise EditError(f"candidate is {size} bytes; the limit is {MAX_SOURCE_BYTES}")
    try:
        tree = parsing.parse(source)
    except SyntaxError as e:
        text = f": {e.text.strip()[:80]!r}" if e.text and e.text.strip() else ""
        raise EditError(f"candidate does not parse: line {e.lineno}: {e.msg}{text}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, lone surrogates; deep nesting on 3.11
        raise EditError(f"candidate does not parse: {type(e).__name__}: {e}"[:200]) from None
    if not any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body):
        raise EditError("candidate does not define class ModelNew at top level")
