"""A model of a kernel family's time over its settings: the tuner's strategy for spaces too large to walk.

One-step moves and random draws need many evaluations where a kernel has several tunables of many values each (a
compile seed with three kernels has nine). Once a family (candidates that differ only in their settings) has
MIN_POINTS timed members, the tuner also proposes the setting this model predicts fastest among those not measured.

The model is additive in log-time: log(ms) = mean + sum over tunables of effect[name][value], each value's effect a
factor on the time. It is fit by ridge regression on one-hot values (RIDGE pulls the effect of a value measured
rarely, or never, towards "no effect"), so it needs only a few points per value, and its minimum is found exactly:
per tunable, the value of smallest effect. It ignores interactions (a block size that suits 8 warps and not 2),
which the gate's measurement of each proposal corrects: the model only orders what is tried next.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

MIN_POINTS = 4  # timed members of a family before the model is trusted to rank settings
RIDGE = 0.3  # in units of one observation: a value seen once keeps about 3/4 of its apparent effect
MAX_DEVIATIONS = 2  # the predicted-fastest settings are searched among those within two changes of the optimum
MAX_OPTIONS = 20_000  # ... or one change, where two would mean more settings than this to rank (huge TUNABLES)
MAX_COLUMNS = 2_000  # values over all tunables past which no model is fit (the regression's size grows with it)


@dataclass
class Model:
    names: list[str]
    values: dict[str, list]
    mean: float
    effect: dict[str, dict[int, float]]  # tunable -> index of the value in its list -> effect on log(ms)

    def predict_ms(self, settings: dict) -> float:
        total = self.mean
        for name in self.names:
            index = _index(self.values[name], settings.get(name))
            total += self.effect[name].get(index, 0.0) if index is not None else 0.0
        return float(np.exp(total))

    def fastest(self, exclude: set[tuple], limit: int = 1) -> list[tuple[dict, float]]:
        """Up to `limit` settings not in `exclude` (keys as from key()), fastest predicted first, among those within
        MAX_DEVIATIONS changes of the model's optimum."""
        ranked = {name: sorted(range(len(self.values[name])), key=lambda i: self.effect[name].get(i, 0.0))
                  for name in self.names}
        best = {name: ranked[name][0] for name in self.names}
        pairs = sum((len(self.values[a]) - 1) * (len(self.values[b]) - 1)
                    for a, b in itertools.combinations(self.names, 2))
        options = []
        for k in range(MAX_DEVIATIONS + 1 if pairs <= MAX_OPTIONS else 2):
            for changed in itertools.combinations(self.names, k):
                for alternatives in itertools.product(*(ranked[n][1:] for n in changed)):
                    choice = best | dict(zip(changed, alternatives))
                    settings = {n: self.values[n][i] for n, i in choice.items()}
                    if key(settings) not in exclude:
                        options.append((settings, self.predict_ms(settings)))
        options.sort(key=lambda option: option[1])
        return options[:limit]


def key(settings: dict) -> tuple:
    """A hashable key of a setting (repr: True and 1 are different values)."""
    return tuple((name, repr(v)) for name, v in sorted(settings.items()))


def fit(points: list[tuple[dict, float]], tunables: dict[str, list]) -> Model | None:
    """The model of these (settings, ms) points, or None with fewer than MIN_POINTS usable ones."""
    names = list(tunables)
    usable = [(s, ms) for s, ms in points if ms and ms > 0 and all(_index(tunables[n], s.get(n)) is not None
                                                                 for n in names)]
    if len(usable) < MIN_POINTS or not names or sum(len(tunables[n]) for n in names) > MAX_COLUMNS:
        return None
    columns = [(n, i) for n in names for i in range(len(tunables[n]))]
    x = np.zeros((len(usable), len(columns)))
    for row, (settings, _) in enumerate(usable):
        for col, (n, i) in enumerate(columns):
            x[row, col] = float(_index(tunables[n], settings[n]) == i)
    y = np.log([ms for _, ms in usable])
    mean = float(y.mean())
    weights = np.linalg.solve(x.T @ x + RIDGE * np.eye(len(columns)), x.T @ (y - mean))
    effect: dict[str, dict[int, float]] = {n: {} for n in names}
    for (n, i), w in zip(columns, weights):
        effect[n][i] = float(w)
    return Model(names, {n: list(tunables[n]) for n in names}, mean, effect)


def _index(values: list, value) -> int | None:
    for i, v in enumerate(values):
        if isinstance(v, bool) == isinstance(value, bool) and isinstance(v, str) == isinstance(value, str) \
                and v == value:
            return i
    return None
