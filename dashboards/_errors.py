"""Errors of the ``dashboards`` package.

Hierarchy::

    DashboardError (ValueError)
     ├── MacroError   a query macro or template variable could not be expanded
     └── LintError    generated dashboards or alert rules break a rule (``.problems``)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DashboardError", "LintError", "MacroError"]


class DashboardError(ValueError):
    """Base of every error raised by ``dashboards``."""


class MacroError(DashboardError):
    """A ``$__macro(...)`` or ``$variable`` in a query could not be expanded."""


class LintError(DashboardError):
    """Generated Grafana files break one or more rules; ``problems`` lists each one."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        listed = "\n  - ".join(self.problems)
        super().__init__(
            f"{len(self.problems)} problem(s) in the generated Grafana files; "
            f"fix the builders in dashboards/:\n  - {listed}"
        )
