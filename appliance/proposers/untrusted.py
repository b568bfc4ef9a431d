"""Text that a candidate produced (its stderr, tracebacks, exception messages, reasons that quote them) goes into the
next prompt only through `untrusted`: bounded, neutralised and fenced, so the model reads it as data and a candidate
cannot write the prompt's instructions. Our own text (verdict names, stages, our numbers) stays outside the fence.

    <untrusted-output source="reason">
    | Traceback (most recent call last):
    | ...
    </untrusted-output>

Inside a fence every line starts with "| ", so nothing in it sits at a line start (no heading, no "system:" line, no
bullet of the prompt's own lists); every "<" is written "&lt;" (no closing tag, no chat-template token such as
<|im_start|>, no SEARCH marker), runs of three backticks or tildes are escaped (no code block), and control and
format characters are shown as escapes. Nothing is dropped except the middle of a text past the bound, which a line
of ours says."""

from __future__ import annotations

import re
import unicodedata

TAG = "untrusted-output"
CLOSE = f"</{TAG}>"
LIMIT = 1500  # characters of the candidate's text shown; the head and the tail of a longer one
PREFIX = "| "

_LESS_THAN = re.compile("[<\uFE64\uFF1C\u2039\u2329\u3008\u27E8\u276E]")  # "<" and its look-alikes
_FENCE_RUN = re.compile(r"`{3,}|~{3,}")
_CONTROL_TOKENS = re.compile(r"\[(/?(?:INST|SYS|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS)\])", re.I)
_LINE_BREAKS = re.compile("\r\n|[\r\u2028\u2029\x0b\x0c\x1c\x1d\x1e\x85]")
_SOURCE = re.compile(r"[^\w ,.'()/:-]")


def untrusted(text: object, source: str, limit: int = LIMIT) -> str:
    """`text` as a fenced block labelled with where it came from (`source`, our words): at most about `limit`
    characters of it (the head and the tail, the middle left out with a line saying so), neutralised so that it can
    neither close the fence nor pass for the prompt's own structure."""
    raw = str(text)
    # Cut a huge text down before the work per character (escapes only grow it: at most 6x), then to the limit.
    body = _neutralise(_cut(raw, 8 * limit)).split("\n")
    lines = [PREFIX + line for line in body]
    shown = _bounded(lines, limit)
    if shown is not lines:
        head, tail = shown
        lines = head + [f"[... the middle of this text of {len(raw):,} characters is left out ...]"] + tail
    label = _SOURCE.sub("", source)[:80] or "candidate"
    return "\n".join([f'<{TAG} source="{label}">', *lines, CLOSE])


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit * 2 // 3] + "\n" + text[-(limit // 3):]


def _neutralise(text: str) -> str:
    text = _LINE_BREAKS.sub("\n", text)
    text = _LESS_THAN.sub("&lt;", text)
    text = _FENCE_RUN.sub(lambda m: "".join("\\" + c for c in m.group()), text)
    text = _CONTROL_TOKENS.sub(r"&#91;\1", text)
    return "".join(_visible(c) for c in text)


def _visible(c: str) -> str:
    if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cf", "Co", "Cs", "Zl", "Zp"):
        return c
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def _bounded(lines: list[str], limit: int) -> list[str] | tuple[list[str], list[str]]:
    """`lines` if they fit in `limit` characters, else (head, tail): whole lines from each end, about two thirds of
    the limit for the head (where an error starts) and one third for the tail (where a traceback ends); a line too
    long for its share is cut, and still starts with the prefix."""
    if sum(len(line) + 1 for line in lines) <= limit:
        return lines

    def take(seq: list[str], budget: int, from_end: bool) -> list[str]:
        out: list[str] = []
        for line in seq:
            if budget <= len(PREFIX):
                break
            if len(line) + 1 > budget:
                keep = budget - len(PREFIX) - 4
                body = line[len(PREFIX):]
                line = PREFIX + ("... " + body[-keep:] if from_end else body[:keep] + " ...") if keep > 0 else ""
                if line:
                    out.append(line)
                break
            out.append(line)
            budget -= len(line) + 1
        return out

    head = take(lines, limit * 2 // 3, from_end=False)
    tail = take(lines[len(head):][::-1], limit - sum(len(line) + 1 for line in head), from_end=True)[::-1]
    return head, tail


# What search/database.py's `feedback` writes about an evaluated candidate: our first line, the verdict's reason
# (which may quote the candidate's output, over several lines), then lines of our numbers. Those are told apart from
# the end, in the order they are written, and only where the verdict has them: a failing candidate's reason cannot
# pass a line of its own off as ours (the evidence lines come only once a candidate reached timing).
_HEAD = re.compile(r"verdict (\w+) at stage (\w+): ")
_OURS = [  # (name, pattern, only for a candidate that reached timing, only for a passing candidate)
    ("speedup", re.compile(r"speedup \S+ vs eager, \S+ vs torch\.compile \([\w .-]+ timing\)"), True, True),
    ("launches", re.compile(r"kernel launches per call: \d+"), True, False),
    ("roofline", re.compile(r"main shape at \d+% of the roofline \(the GPU's measured bandwidth/FLOP ceilings for the "
                            r"task's bytes and FLOPs\)"), True, False),
    ("ncu", re.compile(r"Nsight Compute: DRAM throughput \S+% of peak, achieved occupancy \S+%, top stalls \(cycles "
                       r"per issue\): [\w ,.+-]*"), True, True),
    ("timings", re.compile(r"timings per shape: [^<`\n]*"), True, False),
    ("change", re.compile(r"change: .*"), False, False),
]
_FAILED = re.compile(r"proposal failed: (?:([a-z_]+): )?")


def fence_feedback(text: str) -> str:
    """Evaluator feedback (search/database.py's `feedback`) with the parts a candidate or a model wrote fenced: the
    verdict's reason, the summary of the change, a proposal failure's message; text of any other form is fenced
    whole (where it came from is not known). A fence always starts on a line of its own."""
    text = text.strip()
    if not text or text == "not evaluated yet":
        return text
    if m := _FAILED.match(text):
        kind = f" ({m.group(1)})" if m.group(1) else ""
        return f"proposal failed{kind}:\n" + untrusted(text[m.end():], "proposal failure message")
    m = _HEAD.match(text)
    if not m:
        return "as reported:\n" + untrusted(text, "evaluator feedback")
    verdict, stage = m.groups()
    timed, passed = verdict == "pass" or stage == "timing", verdict == "pass"
    lines = text[m.end():].split("\n")
    ours: list[str] = []
    allowed = [o for o in reversed(_OURS) if (timed or not o[2]) and (passed or not o[3])]
    while len(lines) > 1 and allowed:  # the reason keeps at least the first line
        i = next((i for i, (_, pattern, _, _) in enumerate(allowed) if pattern.fullmatch(lines[-1])), None)
        if i is None:
            break
        ours.insert(0, lines.pop())
        allowed = allowed[i + 1:]
    reason = "\n".join(lines).strip()
    if passed and "\n" not in reason and not re.search(r"[<`\[]|untrusted", reason, re.I):
        out = [f"verdict pass at stage {stage}: {reason}"]  # a pass's reason is the pipeline's own line (its times)
    else:
        out = [f"verdict {verdict} at stage {stage}" + (":\n" + untrusted(reason, "reason") if reason else "")]
    for line in ours:
        if line.startswith("change: "):
            out.append("change (the proposer's own summary):\n" + untrusted(line[len("change: "):], "summary"))
        else:
            out.append(line)
    return "\n".join(out)
