"""How numbers read on screen (one place, so every screen says 1.23x and 0.45 ms the same way)."""

from __future__ import annotations


def times(value: float | None) -> str:
    return f"{value:.3g}x" if value else "-"


def ms(value: float | None) -> str:
    return f"{value:.4g}" if value is not None else "-"


def percent(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def hours(value: float) -> str:
    return f"{value:.2f}"


def energy(joules: float | None) -> str:
    if joules is None:
        return "-"
    if joules >= 3.6e5:
        return f"{joules / 3.6e6:.3f} kWh"
    return f"{joules / 1e3:.1f} kJ" if joules >= 1e3 else f"{joules:.0f} J"


def verdict_style(verdict: str) -> str:
    if verdict == "pass":
        return "green"
    return "yellow" if verdict in ("queued", "evaluating") else "red"
