"""The budgets package's errors.

BudgetError
 +-- BudgetConfigError   a budgets file that is missing, unreadable or invalid
 +-- BudgetStateError    a stored desk state this version cannot read
"""

from __future__ import annotations

__all__ = ["BudgetConfigError", "BudgetError", "BudgetStateError"]


class BudgetError(Exception):
    """Base of the budgets package's errors."""


class BudgetConfigError(BudgetError):
    """A budgets file that cannot be used; the message names the file, budget and value."""


class BudgetStateError(BudgetError):
    """A desk state of another format version (or not a desk state at all)."""
