"""The evolutionary database, a view over a run's rows in the DB (so it survives any restart).

- Islands: each candidate lives on its parent's island; every few generations an island's best migrates to the next
  island (its id is recorded in the run's state), so good ideas spread without every island converging at once.
- MAP-Elites grid: a passing candidate falls into a cell (backend, speed bucket, size bucket); each cell keeps its
  best. Diverse inspirations come from other cells.
- Selection: with probability `exploit` the parent is the island's best, otherwise a random elite of the island's
  grid; the LLM also sees the overall top and a few diverse elites.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from appliance.db.models import Candidate, Evaluation
from appliance.proposers.edits import source_hash


@dataclass
class Entry:
    candidate: Candidate
    evaluation: Evaluation | None

    @property
    def passed(self) -> bool:
        return self.evaluation is not None and self.evaluation.verdict == "pass"

    @property
    def score(self) -> float:
        """Speedup over eager (the baseline every evaluation times); -inf when not a passing, timed candidate."""
        e = self.evaluation
        return e.speedup_vs_eager if self.passed and e.speedup_vs_eager else -math.inf

    @property
    def backend(self) -> str:
        backends = (self.evaluation.details or {}).get("backends") if self.evaluation else None
        return "+".join(backends) if backends else "torch"

    def cell(self) -> tuple[str, int, int]:
        speed = int(math.floor(2 * math.log2(self.score))) if self.score > 0 else -99  # half-octaves of speedup
        size = len(self.candidate.source.splitlines()) // 40
        return self.backend, speed, size


class SearchDatabase:
    def __init__(self, rows: list[tuple[Candidate, Evaluation | None]], islands: int, migrants: dict,
                 rng: random.Random):
        self.entries = [Entry(c, e) for c, e in rows]
        self.islands, self.rng = max(1, islands), rng
        by_id = {e.candidate.id: e for e in self.entries}
        self._members: dict[int, list[Entry]] = {i: [] for i in range(self.islands)}
        for entry in self.entries:
            self._members.setdefault((entry.candidate.island or 0) % self.islands, []).append(entry)
        for island, ids in migrants.items():
            self._members.setdefault(int(island) % self.islands, []).extend(by_id[i] for i in ids if i in by_id)

    def passed(self, island: int | None = None) -> list[Entry]:
        pool = self.entries if island is None else self._members.get(island, [])
        return [e for e in pool if e.passed]

    def best(self, island: int | None = None) -> Entry | None:
        return max(self.passed(island), key=lambda e: e.score, default=None)

    def elites(self, island: int | None = None) -> dict[tuple, Entry]:
        grid: dict[tuple, Entry] = {}
        for entry in self.passed(island):
            cell = entry.cell()
            if cell not in grid or entry.score > grid[cell].score:
                grid[cell] = entry
        return grid

    def select_parent(self, island: int, exploit: float) -> Entry | None:
        best = self.best(island) or self.best()
        elites = list(self.elites(island).values()) or list(self.elites().values())
        if best is None:
            return None
        if self.rng.random() < exploit or len(elites) < 2:
            return best
        return self.rng.choice(elites)

    def inspirations(self, parent: Entry, top: int = 2, diverse: int = 2) -> list[tuple[str, Entry]]:
        ranked = sorted(self.passed(), key=lambda e: -e.score)
        chosen = [("top", e) for e in ranked if e is not parent][:top]
        others = [e for cell, e in self.elites().items() if cell != parent.cell() and e is not parent
                  and all(e is not c for _, c in chosen)]
        chosen += [(f"diverse: {e.backend}", e) for e in self.rng.sample(others, min(diverse, len(others)))]
        return chosen

    def failures(self, limit: int = 6) -> list[Entry]:
        """Recent attempts that failed the gate or could not be proposed: what not to do again."""
        bad = [e for e in self.entries
               if e.candidate.status == "proposal_failed" or (e.evaluation and not e.passed)]
        return bad[-limit:]

    def seen_hashes(self) -> set[str]:
        return {source_hash(e.candidate.source) for e in self.entries if e.candidate.source}

    def migrate(self, migrants: dict) -> dict:
        """Each island's best joins the next island (ids only; nothing is copied or re-evaluated)."""
        out = {str(k): list(v) for k, v in migrants.items()}
        for island in range(self.islands):
            best = self.best(island)
            target = str((island + 1) % self.islands)
            if best is not None and self.islands > 1 and best.candidate.id not in out.setdefault(target, []):
                out[target].append(best.candidate.id)
        return out


def feedback(entry: Entry, timings: list | None = None) -> str:
    """What the gate and the timer said about a candidate, in a few lines for the next proposal; with its Timing
    rows, its time at every shape too (where it is slow is where to look)."""
    c, e = entry.candidate, entry.evaluation
    if c.status == "proposal_failed":
        return f"proposal failed: {c.failure}"
    if e is None:
        return "not evaluated yet"
    lines = [f"verdict {e.verdict} at stage {e.stage}: {e.reason[:700]}"]
    if e.verdict == "pass":
        lines.append(f"speedup {_x(e.speedup_vs_eager)} vs eager, {_x(e.speedup_vs_compile)} vs torch.compile "
                     f"({e.device} timing)")
    details = e.details or {}
    evidence = details.get("evidence") or {}
    if evidence.get("launches_per_call") is not None:
        lines.append(f"kernel launches per call: {evidence['launches_per_call']}")
    if evidence.get("roofline_fraction"):
        lines.append(f"main shape at {evidence['roofline_fraction']:.0%} of the roofline (the GPU's measured "
                     "bandwidth/FLOP ceilings for the task's bytes and FLOPs)")
    ncu = details.get("ncu") or {}
    if "dram_throughput_pct" in ncu:
        stalls = ", ".join(f"{s['reason']} {s['cycles_per_issue']:.1f}" for s in ncu.get("top_stalls", []))
        lines.append(f"Nsight Compute: DRAM throughput {ncu['dram_throughput_pct']:.0f}% of peak, achieved "
                     f"occupancy {ncu['achieved_occupancy_pct']:.0f}%, top stalls (cycles per issue): {stalls}")
    if timings:
        lines.append(_per_shape(timings))
    if c.note:
        lines.append(f"change: {c.note[:200]}")
    return "\n".join(lines)


def _per_shape(timings: list) -> str:
    by_shape: dict[str, dict] = {}
    for t in timings:
        by_shape.setdefault(t.shape, {"sizes": t.sizes})[t.implementation] = t.median_ms
    parts = []
    for shape, row in by_shape.items():
        cand, eager = row.get("candidate"), row.get("eager")
        if cand:
            sizes = ", ".join(f"{k}={v}" for k, v in (row["sizes"] or {}).items())
            parts.append(f"{shape} ({sizes}) {cand:.4g} ms" + (f", {eager / cand:.3g}x eager" if eager else ""))
    return "timings per shape: " + "; ".join(parts)


def _x(value: float | None) -> str:
    return f"{value:.3g}x" if value else "-"
