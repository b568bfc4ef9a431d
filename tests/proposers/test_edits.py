"""appliance.proposers.edits: LLM replies (SEARCH/REPLACE edits or full rewrites, with prose and fences around them)
turned into candidate sources, and the normal form that makes comment- or formatting-only variants duplicates."""

from __future__ import annotations

import ast

import pytest

from appliance.proposers.edits import MAX_SOURCE_BYTES, EditError, apply_reply, normalize_source, source_hash

PARENT = '''\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        relu_kernel[grid](x, out, n, BLOCK=1024)
        return out
'''

REWRITE = '''\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
'''


def fenced(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}```"


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def error_of(reply: str, parent: str = PARENT) -> str:
    with pytest.raises(EditError) as info:
        apply_reply(parent, reply)
    return str(info.value)


# --- SEARCH/REPLACE edits


def test_one_block_in_prose_and_fences():
    reply = (
        "A block of 1024 leaves the SMs underused for this size; 256 gives more blocks in flight.\n\n"
        + fenced(
            block(
                "        grid = (triton.cdiv(n, 1024),)\n        relu_kernel[grid](x, out, n, BLOCK=1024)",
                "        grid = (triton.cdiv(n, 256),)\n        relu_kernel[grid](x, out, n, BLOCK=256)",
            )
            + "\n"
        )
        + "\n\nThis should be faster."
    )
    source, mode = apply_reply(PARENT, reply)
    assert mode == "diff"
    assert "BLOCK=256" in source and "BLOCK=1024" not in source
    assert source == PARENT.replace("1024", "256")


def test_several_blocks_apply_in_order():
    reply = "\n\n".join(
        [
            "First, vectorise the load:",
            block("    x = tl.load(x_ptr + offs, mask=mask)", "    x = tl.load(x_ptr + offs, mask=mask, other=0.0)"),
            "Then (the second edit sees the first one's result):",
            block(
                "    x = tl.load(x_ptr + offs, mask=mask, other=0.0)",
                "    x = tl.load(x_ptr + offs, mask=mask)  # ok",
            ),
            block("        out = torch.empty_like(x)", "        out = torch.empty(x.shape, device=x.device)"),
        ]
    )
    source, mode = apply_reply(PARENT, reply)
    assert mode == "diff"
    assert "mask=mask)  # ok" in source
    assert "out = torch.empty(x.shape, device=x.device)" in source


def test_marker_variants_and_crlf():
    reply = (
        "Edit:\r\n  <<<<<<<< SEARCH\r\n        n = x.numel()\r\n"
        "  ========\r\n        n = x.shape[0]\r\n  >>>>>>>> REPLACE\r\n"
    )
    source, _ = apply_reply(PARENT, reply)
    assert "n = x.shape[0]\n" in source
    assert "\r" not in source


def test_indentation_drifted_search_is_matched_and_replacement_reindented():
    # The model copied the method out of the class at column 0 and left trailing spaces.
    reply = fenced(
        block(
            "def forward(self, x):   \n    out = torch.empty_like(x)\n",
            "def forward(self, x):\n    out = torch.empty_like(x)\n    x = x.contiguous()\n",
        )
        + "\n"
    )
    source, mode = apply_reply(PARENT, reply)
    assert mode == "diff"
    expected = (
        "    def forward(self, x):\n        out = torch.empty_like(x)\n"
        "        x = x.contiguous()\n        n = x.numel()\n"
    )
    assert expected in source
    ast.parse(source)


def test_over_indented_search_is_dedented():
    reply = block(
        "            mask = offs < n\n            x = tl.load(x_ptr + offs, mask=mask)",
        "            mask = offs < n\n            x = tl.load(x_ptr + offs, mask=mask, other=0.0)",
    )
    source, _ = apply_reply(PARENT, reply)
    assert "\n    x = tl.load(x_ptr + offs, mask=mask, other=0.0)\n" in source


def test_search_quoting_part_of_a_line_is_an_exact_substring():
    source, _ = apply_reply(PARENT, block("tl.maximum(x, 0.0)", "tl.where(x > 0, x, 0.0)"))
    assert "tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)" in source
    assert "matches 2 places" in error_of(block("1024", "256"))


def test_search_not_found_names_block_and_first_line():
    reply = block("    x = tl.load(x_ptr + offs)", "    x = tl.load(x_ptr + offs, mask=mask)")
    good = block("        n = x.numel()", "        n = x.numel()  # elements")
    message = error_of(good + "\n" + reply)
    assert message.startswith("edit block 2: SEARCH text not found")
    assert "x = tl.load(x_ptr + offs)" in message


def test_ambiguous_search_is_rejected():
    parent = PARENT + "\n\nclass Other(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    init = "    def __init__(self):\n        super().__init__()"
    message = error_of(block(init, "    def __init__(self):\n        pass"), parent)
    assert "edit block 1" in message and "matches 2 places" in message


def test_empty_search_is_rejected():
    assert error_of(block("\n   ", "import math")) == "edit block 1 has an empty SEARCH section"


def test_truncated_edit_block():
    cut_in_replace = "Here is the change:\n```python\n<<<<<<< SEARCH\n        n = x.numel()\n=======\n        n = x.nu"
    assert error_of(cut_in_replace) == "reply truncated: edit block 1 has no >>>>>>> REPLACE line"
    cut_in_search = block("        n = x.numel()", "        n = 1") + "\n<<<<<<< SEARCH\n        grid = (tri"
    assert error_of(cut_in_search) == "reply truncated: edit block 2 has no ======= line"


def test_malformed_edit_block():
    reply = "<<<<<<< SEARCH\n        n = x.numel()\n>>>>>>> REPLACE\n"
    assert "edit block 1 is malformed" in error_of(reply)


def test_edit_that_breaks_syntax_reports_line():
    message = error_of(block("        n = x.numel()", "        n = x.numel(("))
    assert message.startswith("candidate does not parse: line ")


def test_edit_that_removes_modelnew():
    message = error_of(block("class ModelNew(nn.Module):", "class Model(nn.Module):"))
    assert message == "candidate does not define class ModelNew at top level"


def test_edit_that_only_changes_comments_and_spacing_is_unchanged():
    reply = block("        n = x.numel()", "        n   =   x.numel()    # total elements")
    assert error_of(reply) == "edit leaves the source unchanged"


# --- full rewrites


def test_rewrite_with_prose():
    reply = "The Triton kernel is slower than cuDNN here; use the library call.\n\n" + fenced(REWRITE) + "\n\nDone."
    assert apply_reply(PARENT, reply) == (REWRITE, "rewrite")


def test_rewrite_with_bare_fence():
    assert apply_reply(PARENT, fenced(REWRITE, lang="")) == (REWRITE, "rewrite")


def test_rewrite_prefers_last_block_defining_modelnew():
    draft = REWRITE.replace("torch.relu(x)", "x.clamp(min=0)")
    reply = "\n".join(
        [
            "Draft:",
            fenced(draft),
            "Usage:",
            fenced("model = ModelNew()\nmodel(torch.randn(4))\n"),
            "Final version:",
            fenced(REWRITE),
            "The CUDA side would be:",
            fenced("class ModelNew { };\n", lang="cpp"),
            "And a test:",
            fenced("print(ModelNew()(torch.ones(2)))\n"),
        ]
    )
    assert apply_reply(PARENT, reply) == (REWRITE, "rewrite")


def test_rewrite_block_may_quote_shorter_fences():
    docstring = '    """Usage:\n    ```\n    ModelNew()(x)\n    ```\n    """\n\n'
    code = REWRITE.replace("    def forward", docstring + "    def forward")
    source, _ = apply_reply(PARENT, "````python\n" + code + "````\n")
    assert source == code


def test_indented_fence_is_dedented():
    reply = "1. Replace the file:\n\n" + "\n".join("    " + line for line in fenced(REWRITE).split("\n"))
    assert apply_reply(PARENT, reply) == (REWRITE, "rewrite")


def test_no_block_defines_modelnew():
    reply = "Use this helper:\n" + fenced("def helper(x):\n    return x\n")
    assert error_of(reply) == "no code block defines class ModelNew"


def test_rewrite_with_syntax_error():
    broken = REWRITE.replace("return torch.relu(x)", "return torch.relu(x")
    message = error_of(fenced(broken))
    assert message.startswith("candidate does not parse: line 7: ")
    assert "torch.relu(x" in message


def test_rewrite_with_modelnew_not_at_top_level():
    nested = "import torch\n\nif True:\n    class ModelNew(torch.nn.Module):\n        pass\n"
    assert error_of(fenced(nested)) == "no code block defines class ModelNew"
    # The block-picking regex sees a column-0 class, but the checked result must still hold it at top level.
    in_string = 'X = """\nclass ModelNew:\n    pass\n"""\n'
    assert error_of(fenced(in_string)) == "candidate does not define class ModelNew at top level"


def test_truncated_rewrite():
    reply = "Here is the new kernel:\n\n```python\n" + REWRITE[:60]
    assert error_of(reply) == "reply truncated: code block opened at line 3 is never closed"


def test_rewrite_identical_to_parent_modulo_comments():
    reply = fenced("# faster!\n" + PARENT.replace("    pid = tl.program_id(0)", "    pid = tl.program_id(0)  # row"))
    assert error_of(reply) == "rewrite is identical to the parent"


def test_oversized_rewrite():
    padding = "# " + "x" * 100 + "\n"
    huge = REWRITE + padding * (MAX_SOURCE_BYTES // len(padding) + 1)
    assert "the limit is" in error_of(fenced(huge))


# --- replies that are not edits at all


@pytest.mark.parametrize("reply", ["", "   \n\t", None])
def test_empty_reply(reply):
    assert error_of(reply) == "reply is empty"


def test_prose_only_reply():
    message = error_of("I think the kernel is already optimal 🚀✨. Consider larger batches!")
    assert message == "reply has no code block and no SEARCH/REPLACE edit"


def test_garbage_bytes_in_code_block():
    garbage = bytes(range(256)).decode("latin-1")
    message = error_of(fenced("class ModelNew:\n    x = 1\n" + garbage + "\n"))
    assert message.startswith("candidate does not parse")


def test_emoji_in_strings_and_comments_are_fine():
    code = REWRITE.replace("return torch.relu(x)", 'return torch.relu(x)  # 🔥 "fast"\n\nLABEL = "ReLU ⚡"')
    source, _ = apply_reply(PARENT, "🎉 Done:\n" + fenced(code))
    assert "⚡" in source


def test_pathological_nesting_does_not_crash():
    assert "does not parse" in error_of(fenced("class ModelNew:\n    x = " + "-" * 100_000 + "1\n"))
    assert "too many nested parentheses" in error_of(fenced("class ModelNew:\n    x = " + "(" * 300 + ")" * 300 + "\n"))


def test_lone_surrogate_does_not_crash():
    assert "does not parse" in error_of(fenced(REWRITE + 'S = "\ud800"\n'))


# --- normalization and hashing


def test_comments_whitespace_and_docstrings_do_not_change_the_hash():
    variant = (
        '"""Module docstring."""\n'
        + PARENT.replace("class ModelNew(nn.Module):\n", 'class ModelNew(nn.Module):\n    """Fast ReLU."""\n\n')
        .replace("    pid = tl.program_id(0)\n", "    # one program per block\n    pid = tl.program_id( 0 )\n\n")
        .replace("grid = (triton.cdiv(n, 1024),)", "grid = ( triton.cdiv(n,1024), )")
    )
    assert variant != PARENT
    assert normalize_source(variant) == normalize_source(PARENT)
    assert source_hash(variant) == source_hash(PARENT)


def test_docstring_only_body_still_unparses():
    source = 'class ModelNew:\n    """Nothing yet."""\n'
    assert normalize_source(source) == "class ModelNew:\n    pass"


def test_real_changes_change_the_hash():
    assert source_hash(PARENT) != source_hash(PARENT.replace("1024", "512"))
    assert source_hash(PARENT) != source_hash(PARENT.replace("0.0", "0.1"))


def test_unparseable_source_falls_back_to_collapsed_whitespace():
    assert normalize_source("def f(:\n    return   1\n") == "def f(: return 1"
    assert source_hash("def f(:\n  return 1") == source_hash("def f(:   return 1\n\n")
    assert len(source_hash("")) == 64
