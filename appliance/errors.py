"""Exceptions for problems that stop an evaluation before any verdict: bad input or broken infrastructure.

A candidate that fails is not an exception: it gets a verdict (see appliance.evaluation.verdict)."""

from __future__ import annotations


class ApplianceError(Exception):
    """Base class; the CLI turns these into a message and an exit code."""

    exit_code = 2


class TaskError(ApplianceError):
    """The task (or its manifest) is malformed. Names the file and, where known, the line."""

    def __init__(self, path: str, message: str, line: int | None = None):
        self.path, self.line, self.message = path, line, message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")


class InfrastructureError(ApplianceError):
    """The appliance itself cannot evaluate here (jail missing, harness crashed on the trusted side)."""

    exit_code = 3


class ConfigError(ApplianceError):
    """A setting (an environment variable or a flag) has a value the appliance cannot use; names it."""


class EvaluationCancelled(ApplianceError):
    """An evaluation called off before it began measuring (a run's time ran out, or it was paused or stopped): no
    verdict, and nothing against the candidate, which goes back to the queue."""
