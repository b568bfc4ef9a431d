"""`appliance export RUN`: the run's approved winner (or, not yet approved, its best candidate) as a patch against
the task's source and a drop-in module, with a report for the code reviewer in Markdown and self-contained HTML
(plots are inline SVG drawn here: nothing is fetched when the report is opened on an air-gapped machine).

The report holds what a reviewer needs to trust the number without the appliance: the approval record, the diff,
hardware and versions, tolerances and seeds, every shape's timings with their spread, the gate's checks and the
search that found the candidate."""

from __future__ import annotations

import difflib
import html
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from appliance import parsing
from appliance.db import Store, Timing
from appliance.errors import ApplianceError
from appliance.review import Winner, convergence, lineage, winner
from appliance.tasks import Manifest, Task
from sandbox.harness.compare import PRECISION_FACTOR, UNIT_ROUNDOFF

# What a passing verdict rules out (README "Verdicts"): each is checked on every evaluation; GPU-only ones are marked.
GATE_CHECKS = [
    ("jail", "ran jailed: no network, read-only system, seccomp, memory/process/time limits", False),
    ("load_error / compile_error", "the module loaded and its kernels compiled", False),
    ("backend_not_allowed", "uses only backends the task allows", False),
    ("library_fallback", "launched its own kernel(s) and called none of the reference's library ops", False),
    ("runtime_error, wrong_shape, wrong_dtype, nan_inf, wrong_output",
     "matched the float64 reference within tolerance on every shape and seed (fresh inputs)", False),
    ("input_mutated", "left its inputs unchanged", False),
    ("deferred_work", "finished all its work before forward returned", False),
    ("timed_output_mismatch", "the timed calls checked in secret (fresh inputs each) were also correct", False),
    ("protocol_error", "its kernel server answered the referee within the protocol", False),
    ("timing_mismatch", "a speedup over 10x against torch.compile held when measured again", True),
    ("impossible", "no faster than the GPU's memory bandwidth or FLOP rate allows", True),
]


@dataclass
class Exported:
    out_dir: Path
    files: list[Path]
    run_id: int
    candidate_id: int
    evaluation_id: int
    approved: bool


def export_run(store: Store, run_id: int, out_dir: Path) -> Exported:
    run = store.get_run(run_id)
    if run is None:
        raise ApplianceError(f"no run {run_id} (see `appliance runs`)")
    won = winner(store, run_id)
    if won is None:
        raise ApplianceError(f"run {run_id} has no candidate that passed the gate: nothing to export")
    task_row = store.get_task(run.task_id)
    _, timings = store.get_evaluation(won.evaluation.id)
    name = task_row.name
    out_dir.mkdir(parents=True, exist_ok=True)
    patch = drop_in_patch(task_row.source, won.candidate.source, name, f"run {run.id}, candidate c{won.candidate.id}"
                          + ("" if won.approved else ", NOT APPROVED"))
    rows = store.run_candidates(run_id)
    charts = {"speedup.svg": speedup_chart(timings), "convergence.svg": convergence_chart(convergence(rows)),
              "roofline.svg": roofline_chart(timings)}
    report = _report(store, run, task_row, won, timings, patch, rows)
    files = {
        f"{name}.patch": patch,
        f"{name}_optimized.py": won.candidate.source,  # exactly the source that was evaluated (and approved)
        "report.md": report.markdown(),
        "report.html": report.html(charts),
        "evaluation.json": json.dumps(won.evaluation.model_dump() | {"timings": [t.model_dump() for t in timings]},
                                      indent=1, default=str),
        **charts,
    }
    for filename, text in files.items():
        (out_dir / filename).write_text(text)
    return Exported(out_dir, [out_dir / f for f in files], run_id, won.candidate.id, won.evaluation.id, won.approved)


def drop_in_patch(task_source: str, winner_source: str, name: str, origin: str) -> str:
    """A patch that leaves the task module working with the winner in Model's place: it adds NAME_optimized.py
    (the winner, exactly as evaluated) and, in NAME.py, renames the reference class ReferenceModel and binds Model
    to the winner's ModelNew, loaded from the file beside it. get_inputs(), get_init_inputs(), the sizes and every
    helper of the task stay as they were, so code that imports Model from it gets the optimised one."""
    if not re.fullmatch(r"[A-Za-z_][\w.-]*", name):
        raise ApplianceError(f"the task's file name {name!r} cannot name a module: no drop-in patch")
    patched = _rename_class(task_source, "Model", "ReferenceModel")
    patched = patched.rstrip("\n") + "\n" + DROP_IN.format(origin=origin.replace("\n", " "), name=name)
    return (unified_diff(task_source, patched, f"a/{name}.py", f"b/{name}.py")
            + unified_diff("", winner_source, "/dev/null", f"b/{name}_optimized.py"))


DROP_IN = '''

# --- Optimised by the Kernel Optimizer Appliance ({origin}): the winner, {name}_optimized.py beside this
# file, takes Model's place; the reference stays as ReferenceModel.
def _optimized_model():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).with_name("{name}_optimized.py")
    spec = importlib.util.spec_from_file_location(f"{{__name__}}_optimized", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModelNew


Model = _optimized_model()
'''


def _rename_class(source: str, old: str, new: str) -> str:
    """`class old` renamed `new` where it is defined (the top-level class statement, found by ast), and
    `super(old, self)` inside it too; other uses of the name then mean the winner."""
    import ast

    found = [n for n in parsing.parse(source).body if isinstance(n, ast.ClassDef) and n.name == old]
    if len(found) != 1:
        raise ApplianceError(f"the task defines class {old} {len(found)} times at the top level: no drop-in patch")
    cls = found[0]
    lines = source.split("\n")
    first = cls.lineno - 1 + len(cls.decorator_list)  # the `class` line (ast's lineno is the first decorator's)
    while not re.match(rf"\s*class\s+{old}\b", lines[first]):
        first += 1
    lines[first] = re.sub(rf"\bclass\s+{old}\b", f"class {new}", lines[first], count=1)
    for i in range(first + 1, cls.end_lineno):  # Python 2-style super() in the class's own methods
        lines[i] = re.sub(rf"\bsuper\(\s*{old}\s*,", f"super({new},", lines[i])
    return "\n".join(lines)


def unified_diff(old: str, new: str, old_name: str, new_name: str) -> str:
    """A patch `git apply` / `patch -p1` accept, including files that do not end in a newline."""
    lines = difflib.unified_diff(_lines(old), _lines(new), old_name, new_name)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _lines(text: str) -> list[str]:
    """Lines ending at "\n" only: str.splitlines also breaks at \r, \f, U+2028..., which GNU patch does not."""
    return [line for line in re.split(r"(?<=\n)", text) if line]


# --- the report: one list of blocks, rendered to Markdown and to HTML ---


@dataclass
class Report:
    title: str
    blocks: list[tuple] = field(default_factory=list)

    def h2(self, text: str) -> None:
        self.blocks.append(("h2", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, headers: list[str], rows: list[list]) -> None:
        self.blocks.append(("table", headers, [[_cell(v) for v in row] for row in rows]))

    def figure(self, filename: str, caption: str) -> None:
        self.blocks.append(("figure", filename, caption))

    def code(self, lang: str, text: str) -> None:
        self.blocks.append(("code", lang, text))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, *a in self.blocks:
            if kind == "h2":
                out += [f"## {a[0]}", ""]
            elif kind == "p":
                out += [a[0], ""]
            elif kind == "table":
                out += ["| " + " | ".join(a[0]) + " |", "|" + "---|" * len(a[0])]
                out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in a[1]] + [""]
            elif kind == "figure":
                out += [f"![{a[1]}]({a[0]})", ""]
            elif kind == "code":
                fence = "````" if "```" in a[1] else "```"
                out += [fence + a[0], a[1].rstrip("\n"), fence, ""]
        return "\n".join(out)

    def html(self, charts: dict[str, str]) -> str:
        e = html.escape
        out = [f"<h1>{e(self.title)}</h1>"]
        for kind, *a in self.blocks:
            if kind == "h2":
                out.append(f"<h2>{e(a[0])}</h2>")
            elif kind == "p":
                out.append(f"<p>{e(a[0])}</p>")
            elif kind == "table":
                head = "".join(f"<th>{e(h)}</th>" for h in a[0])
                body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in a[1])
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif kind == "figure":
                out.append(f"<figure>{charts[a[0]]}<figcaption>{e(a[1])}</figcaption></figure>")
            elif kind == "code":
                out.append(f"<pre><code>{e(a[1])}</code></pre>")
        return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{e(self.title)}</title>"
                f"<style>{_CSS}</style></head><body>\n" + "\n".join(out) + "\n</body></html>\n")


_CSS = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;"
        "font-size:90%}th{background:#f3f3f3}pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:85%}"
        "figure{margin:1em 0}figcaption{font-size:85%;color:#555}")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return " ".join(str(value).split())  # one line: a newline would end a Markdown table row


def _x(value: float | None) -> str:
    return f"{value:.3g}x" if value else "-"


def _report(store: Store, run, task_row, won: Winner, timings: list[Timing], patch: str, rows) -> Report:
    c, ev = won.candidate, won.evaluation
    cpu = ev.device != "cuda"
    report = Report(f"Run {run.id}: {task_row.name}, candidate {c.id}, {_x(ev.speedup_vs_eager)} vs eager")
    a = won.approval
    report.p(f"APPROVED by {a.who} on {a.created_at:%Y-%m-%d %H:%M} UTC: {a.comment}" if a else
             "NOT APPROVED: this is the run's best candidate, exported for review. Approve it in `appliance tui` "
             f"or with `appliance approve {c.id} --comment ...` before shipping it.")
    report.p(f"Verdict {ev.verdict}: {ev.reason}." + (" CPU timings (Triton interpreter): they show the path works, "
                                                     "not GPU speed." if cpu else ""))

    report.h2("Files")
    report.table(["file", "what"], [
        [f"{task_row.name}.patch", f"`patch -p1` or `git apply` next to the task file ({task_row.path}): adds "
                                   f"{task_row.name}_optimized.py and makes the task's `Model` the winner (the "
                                   "reference stays as `ReferenceModel`; inputs, sizes and helpers stay)"],
        [f"{task_row.name}_optimized.py", "the winner as a drop-in module: `ModelNew` takes `Model`'s constructor "
                                          "arguments and inputs; exactly the evaluated source"],
        ["evaluation.json", "the stored evaluation and timing rows, as recorded"],
    ])

    report.h2("Speedup per shape")
    baselines = sorted({t.implementation for t in timings} - {"candidate"})
    over = " and ".join("torch.compile" if b == "compile" else "eager PyTorch" if b == "eager" else b
                        for b in baselines) or "no baseline"
    report.figure("speedup.svg", f"Speedup of the winner over {over}, per shape (log scale, right of 1x is "
                                 "faster)" + (": CPU timings, not GPU speed." if cpu else "."))
    report.table(["shape", "sizes", "implementation", "median ms", "IQR ms", "min ms", "reps", "speedup",
                  "roofline", "GB/s", "mJ/call", "device-wide ms"], _timing_rows(timings))

    report.h2("Correctness gate")
    manifest = _manifest(task_row.manifest)
    cases = ev.details.get("cases") or []
    passed_cases = sum(1 for case in cases if case.get("kind") == "pass")
    report.p(f"{passed_cases} of {len(cases)} checked calls matched the float64 reference "
             f"({len({case.get('shape') for case in cases})} shapes, seeds 0..{manifest.seeds - 1} each, plus one "
             "timed call per shape). A pass means none of these checks fired:")
    report.table(["check (verdict it would give)", "what passing shows", "ran"],
                 [[name, what, _ran(name, gpu_only, cpu, ev.jailed)] for name, what, gpu_only in GATE_CHECKS])
    task = Task(path=Path(task_row.path), source=task_row.source, sizes={}, manifest=manifest)
    dtypes = sorted({o.get("dtype") for s in ev.details.get("shapes") or [] for o in s.get("outputs", [])} - {None})
    tolerances = task.tolerances()
    tied = (f"precision-tied: within {PRECISION_FACTOR:g}x the task Model's own error in its dtype, plus roundoff "
            "(sandbox/harness/compare.py)")
    report.table(["dtype", "bound"],
                 [[d, f"atol {tolerances[d]['atol']:g}, rtol {tolerances[d]['rtol']:g} (manifest)" if d in tolerances
                   else (tied if d in UNIT_ROUNDOFF else "exact")] for d in (dtypes or sorted(tolerances))])
    report.table(["shape", "input shapes", "distribution", "layout"], _shape_rows(ev.details, manifest))
    report.table(["shape", "seed", "result"], [[case.get("shape"), case.get("seed"), case.get("kind")]
                                               for case in cases])

    report.h2("Evidence")
    evidence = ev.details.get("evidence") or {}
    provenance = ev.details.get("provenance") or {}
    report.table(["item", "value"], [
        ["kernel launches per call", evidence.get("launches_per_call")],
        ["ATen ops in forward", ", ".join(provenance.get("ops") or []) or "-"],
        ["backends", ", ".join(ev.details.get("backends") or []) or "-"],
        ["roofline fraction (main shape)", evidence.get("roofline_fraction")],
        ["energy per call (J, main shape)", evidence.get("energy_j_per_call")],
        ["Nsight Compute", json.dumps(ev.details.get("ncu")) if ev.details.get("ncu") else "not profiled"],
        ["jail limits", json.dumps((ev.details.get("jail") or {}).get("limits")) or "-"],
    ])
    report.figure("roofline.svg", "Fraction of the roofline (speed of light for the task's bytes and FLOPs on "
                                  "this GPU's measured ceilings) per shape.")

    report.h2("Hardware and versions")
    report.table(["item", "value"], [
        ["device", f"{ev.device} ({ev.mode} sizes)"], ["jailed", ev.jailed], ["GPU index", ev.details.get("gpu_index")],
        ["evaluated", f"{ev.created_at:%Y-%m-%d %H:%M} UTC"],
        *([k, v] for k, v in sorted((ev.environment or {}).items()))])

    report.h2("How it was found")
    chain = lineage(store, c)
    report.table(["candidate", "proposer", "generation", "note"],
                 [[x.id, x.proposer, x.generation, x.note] for x in chain])
    config = run.config or {}
    state = run.state or {}
    report.table(["search", "value"], [
        ["proposer", config.get("proposer")], ["search seed", config.get("seed")],
        ["budget (candidates)", config.get("max_candidates")], ["evaluated", sum(1 for _, e in rows if e)],
        ["passed", sum(1 for _, e in rows if e and e.verdict == "pass")],
        ["GPU hours", round(state.get("gpu_seconds", 0.0) / 3600, 3)], ["energy (J, NVML)", state.get("energy_j")],
        ["wall seconds", state.get("elapsed_s")],
        ["LLM tokens", sum(x.tokens_in + x.tokens_out for x, _ in rows)],
    ])
    report.figure("convergence.svg", "Best speedup vs eager after each evaluation of the run.")

    report.h2("Diff against the task's reference")
    report.code("diff", patch)

    report.h2("Review record")
    approvals = store.approvals(run.id)
    report.table(["when (UTC)", "who", "decision", "candidate", "comment"],
                 [[f"{x.created_at:%Y-%m-%d %H:%M}", x.who, x.decision, x.candidate_id, x.comment] for x in approvals]
                 or [["-", "-", "no decision yet", "-", "-"]])
    rechecks = store.rechecks(c.id)
    if rechecks:
        report.table(["recheck (UTC)", "evaluation", "result", "reason"],
                     [[f"{r.created_at:%Y-%m-%d %H:%M}", r.evaluation_id, "REGRESSION" if r.regressed else "ok",
                       r.reason] for r in rechecks])
    return report


def _ran(check: str, gpu_only: bool, cpu: bool, jailed: bool) -> str:
    if check == "jail" and not jailed:
        return "NO: evaluated with --unsafe-no-jail"
    return "not on CPU" if gpu_only and cpu else "yes"


def _timing_rows(timings: list[Timing]) -> list[list]:
    candidate = {t.shape: t.median_ms for t in timings if t.implementation == "candidate"}
    rows = []
    for t in timings:
        mine = candidate.get(t.shape)
        speedup = "-" if t.implementation == "candidate" else _x(t.median_ms / mine if t.median_ms and mine else None)
        sizes = ", ".join(f"{k}={v}" for k, v in (t.sizes or {}).items())
        rows.append([t.shape, sizes, t.implementation if not t.error else f"{t.implementation} (failed: {t.error})",
                     t.median_ms, t.iqr_ms, t.min_ms, t.reps, speedup,
                     f"{t.roofline_fraction:.0%}" if t.roofline_fraction else "-", t.gbps,
                     t.energy_j_per_call * 1e3 if t.energy_j_per_call else None, t.device_wide_ms])
    return rows


def _shape_rows(details: dict, manifest: Manifest) -> list[list]:
    extra = {s.name: s for s in manifest.shapes}
    rows = []
    for s in details.get("shapes") or []:
        spec = extra.get(s["name"])
        dist = (spec.distribution if spec and spec.distribution else manifest.distribution).kind
        rows.append([s["name"], " ".join(str(tuple(x)) for x in s.get("input_shapes", [])), dist,
                     spec.layout if spec else "contiguous"])
    return rows


def _manifest(text: str) -> Manifest:
    # The manifest as stored with the task (the file on disk may have changed since).
    try:
        return Manifest.model_validate(tomllib.loads(text)) if text.strip() else Manifest()
    except (tomllib.TOMLDecodeError, ValueError):
        return Manifest()


# --- inline SVG charts ---

W, H, PAD = 640, 240, 48


def _svg(body: list[str], title: str, height: int = H) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{height}' viewBox='0 0 {W} {height}' "
            f"font-family='sans-serif' font-size='11'><title>{html.escape(title)}</title>"
            f"<text x='{PAD}' y='16' font-size='13'>{html.escape(title)}</text>" + "".join(body) + "</svg>\n")


def _text(x: float, y: float, s: str, anchor: str = "start", color: str = "#333") -> str:
    return f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' fill='{color}'>{html.escape(s)}</text>"


def speedup_chart(timings: list[Timing]) -> str:
    """Horizontal bars per shape and baseline on a log scale around 1x: right is faster, left slower."""
    candidate = {t.shape: t.median_ms for t in timings if t.implementation == "candidate"}
    bars = [(f"{t.shape} vs {'torch.compile' if t.implementation == 'compile' else t.implementation}",
             t.median_ms / candidate[t.shape]) for t in timings
            if t.implementation != "candidate" and t.median_ms and candidate.get(t.shape)]
    title = "Speedup per shape (log scale)"
    if not bars:
        return _svg([_text(PAD, 60, "no timings")], title, 80)
    height = 40 + 22 * len(bars) + 20
    span = max(max(abs(math.log10(v)) for _, v in bars), math.log10(2))
    left, width = 200, W - 200 - 60
    mid = left + width / 2
    body = [f"<line x1='{mid}' y1='28' x2='{mid}' y2='{height - 16}' stroke='#888'/>",
            _text(mid, height - 4, "1x", "middle")]
    for i, (label, value) in enumerate(bars):
        y = 32 + 22 * i
        end = mid + (math.log10(value) / span) * (width / 2)
        color = "#2a8" if value >= 1 else "#c54"
        body += [_text(left - 6, y + 12, label, "end"),
                 f"<rect x='{min(mid, end):.1f}' y='{y}' width='{abs(end - mid):.1f}' height='16' fill='{color}'/>",
                 _text(max(mid, end) + 4, y + 12, f"{value:.3g}x")]
    return _svg(body, title, height)


def convergence_chart(points: list[float]) -> str:
    """Best speedup vs eager after each evaluation: a step line."""
    title = "Convergence: best speedup vs eager over evaluations"
    if not points:
        return _svg([_text(PAD, 60, "no evaluations")], title, 80)
    top = max(max(points), 1e-9) * 1.15
    x0, x1, y0, y1 = 90, W - 20, H - 30, 40
    n = max(len(points) - 1, 1)

    def xy(i: int, v: float) -> str:
        return f"{x0 + (x1 - x0) * i / n:.1f},{y0 - (y0 - y1) * v / top:.1f}"

    steps = [xy(0, points[0])]
    for i in range(1, len(points)):
        steps += [xy(i, points[i - 1]), xy(i, points[i])]
    body = [f"<line x1='{x0}' y1='{y0}' x2='{x1}' y2='{y0}' stroke='#888'/>",
            f"<line x1='{x0}' y1='{y0}' x2='{x0}' y2='{y1}' stroke='#888'/>",
            f"<polyline points='{' '.join(steps)}' fill='none' stroke='#26a' stroke-width='2'/>",
            _text(x0 - 4, y1 + 4, f"{top:.3g}x", "end"), _text(x0 - 4, y0, "0", "end"),
            _text(x1, y0 + 16, f"{len(points)} evaluations", "end"),
            _text(x1, y1 - 6, f"best {points[-1]:.3g}x", "end")]
    if 1.0 < top:
        y = y0 - (y0 - y1) / top
        body.append(f"<line x1='{x0}' y1='{y:.1f}' x2='{x1}' y2='{y:.1f}' stroke='#aaa' stroke-dasharray='4'/>")
        body.append(_text(x0 - 4, y + 4, "1x", "end"))
    return _svg(body, title)


def roofline_chart(timings: list[Timing]) -> str:
    """Fraction of the roofline reached per shape, 100% being the speed of light on this GPU."""
    rows = [(t.shape, t.roofline_fraction) for t in timings if t.implementation == "candidate" and t.roofline_fraction]
    title = "Fraction of roofline per shape"
    if not rows:
        return _svg([_text(PAD, 50, "not measured: roofline needs a GPU's measured ceilings and the task's "
                                    "FLOP/byte counts (CPU timings have none)")], title, 70)
    height = 40 + 22 * len(rows) + 20
    left, width = 160, W - 160 - 70
    body = [f"<line x1='{left + width}' y1='28' x2='{left + width}' y2='{height - 16}' stroke='#888' "
            "stroke-dasharray='4'/>", _text(left + width, height - 4, "100%", "middle")]
    for i, (shape, fraction) in enumerate(rows):
        y = 32 + 22 * i
        body += [_text(left - 6, y + 12, shape, "end"),
                 f"<rect x='{left}' y='{y}' width='{width * min(fraction, 1.2):.1f}' height='16' fill='#26a'/>",
                 _text(left + width * min(fraction, 1.2) + 4, y + 12, f"{fraction:.0%}")]
    return _svg(body, title, height)
